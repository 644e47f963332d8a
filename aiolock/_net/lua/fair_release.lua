-- Release one hold of a fair lock: Redisson RFairLock unlock, with the unlock latch.
--
-- KEYS[1]  lock hash
-- KEYS[2]  queue "redisson_lock_queue:{name}"
-- KEYS[3]  timeouts "redisson_lock_timeout:{name}"
-- KEYS[4]  channel base "redisson_lock__channel:{name}" (a waiter listens on "<base>:<id>")
-- KEYS[5]  unlock latch "redisson_unlock_latch:{name}:<request id>"
-- ARGV[1]  unlock message "0"
-- ARGV[2]  lease in ms to re-apply while holds remain
-- ARGV[3]  holder id
-- ARGV[4]  now: the caller's wall clock in epoch ms
-- ARGV[5]  publish command: PUBLISH or SPUBLISH
-- ARGV[6]  latch TTL in ms
--
-- Returns nil if the holder has no hold, 0 if holds remain, 1 if the lock was released
-- (then ARGV[1] was published to the channel of the waiter at the head of the queue, and
-- to no one else: exactly one waiter wakes). A resend of the same call (same request id)
-- replays the first result from the latch instead of decrementing again.
--
-- Deliberate difference from Redisson: when the lock key is absent (its lease ran out, or
-- force_unlock deleted it) Redisson reports success (1, and latch 1) to a caller that holds
-- nothing. This returns nil instead, so the caller raises LockNotOwnedError, or
-- LockLostError if it believed it held the lock, as it does for the plain lock; no latch
-- is written (a resend finds the key absent again and answers the same). It still
-- publishes to the head, as Redisson does: a lease that ran out published nothing, and the
-- head may otherwise sleep until its wait bound before it notices the lock is free.
--
-- Everything is read before anything is written, and the message is published first: a
-- refused PUBLISH (ACL) then fails the script with the hold still there, as the caller's
-- bookkeeping assumes after an error. Subscribers receive it after the script either
-- way, and the state stored is the same as in Redisson's order.

--@include times
--@include fair_purge
--@include latch
check_ms(ARGV[2], ARGV[6])

local function release()
    local expired, head = expired_waiters(tonumber(ARGV[4]))
    local function wake_head()
        if head then
            redis.call(ARGV[5], KEYS[4] .. ':' .. head, ARGV[1])
        end
    end
    if redis.call('exists', KEYS[1]) == 0 then
        wake_head()
        pop_waiters(expired)
        return nil
    end
    local count = tonumber(redis.call('hget', KEYS[1], ARGV[3]))
    if not count then
        pop_waiters(expired)
        return nil
    end
    if count > 1 then
        pop_waiters(expired)
        redis.call('hincrby', KEYS[1], ARGV[3], -1)
        redis.call('pexpire', KEYS[1], ARGV[2])
        return 0
    end
    wake_head()
    pop_waiters(expired)
    redis.call('del', KEYS[1])
    return 1
end
return latched(KEYS[5], ARGV[6], release)
