-- A waiter gives up (its try_lock wait ran out, or it was cancelled or failed): it leaves
-- the queue at once, Redisson RFairLock acquireFailed.
--
-- KEYS[1]  lock hash
-- KEYS[2]  queue "redisson_lock_queue:{name}"
-- KEYS[3]  timeouts "redisson_lock_timeout:{name}"
-- KEYS[4]  channel base "redisson_lock__channel:{name}"
-- ARGV[1]  holder id
-- ARGV[2]  W of the call that gives up, in ms (the one its acquire attempts were sent with)
-- ARGV[3]  now: the caller's wall clock in epoch ms
-- ARGV[4]  unlock message "0"
-- ARGV[5]  publish command
--
-- Returns 1 if the holder was queued (and is not any more), else 0.
--
-- As Redisson: every waiter behind the holder moves up by W (their deadlines were counted
-- from its deadline, which was counted with W), then the holder is removed from the
-- timeouts and the queue. Unlike Redisson, it then purges expired waiters at the head and,
-- if the head changed while the lock is free, publishes ARGV[4] to the new head: a holder
-- that gave up right after the release was published to it would otherwise leave the next
-- waiter asleep until its wait bound. Resending it is harmless (the holder is not found).
--
-- Everything is decided before anything is written, and the message is published first:
-- a refused PUBLISH (ACL) then fails the script with nothing changed. Subscribers receive
-- it after the script either way, and the state stored is the same as in the order above.

--@include times
--@include fair_purge
--@include fair_leave_queue
check_ms(ARGV[2])

local function wake(head)
    redis.call(ARGV[5], KEYS[4] .. ':' .. head, ARGV[4])
end
if leave_queue(ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), wake) then
    return 1
end
return 0
