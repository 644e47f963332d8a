-- Undo a fair acquire whose reply never arrived (the caller was cancelled while it was in
-- flight), so no hold and no queue entry is left that nobody knows about.
--
-- KEYS[1]  lock hash
-- KEYS[2]  queue "redisson_lock_queue:{name}"
-- KEYS[3]  timeouts "redisson_lock_timeout:{name}"
-- KEYS[4]  channel base "redisson_lock__channel:{name}"
-- KEYS[5]  cancel tombstone of that acquire call (the same KEYS[4] it was sent with)
-- ARGV[1]  holder id
-- ARGV[2]  the count the acquire would have produced
-- ARGV[3]  lease in ms to re-apply while holds remain
-- ARGV[4]  W the acquire was sent with, in ms
-- ARGV[5]  now: the caller's wall clock in epoch ms
-- ARGV[6]  unlock message "0"
-- ARGV[7]  publish command
-- ARGV[8]  tombstone TTL in ms
-- ARGV[9]  "1" if the acquire was the waiting variant (it may have joined the queue)
--
-- Returns 1 if the acquire had taken a hold and it was given back, else 0.
--
-- The tombstone is always written: an acquire that reaches the server after this is void
-- ({-1, 0}), whichever branch ran. A hold the acquire took (the count is the one it would
-- have produced) is given back as fair_release.lua does: one level, or all of it, and
-- then the waiter at the head is woken (the deadlines its acquire moved up stay moved, as
-- after any acquire and release). Otherwise the holder leaves the queue as in
-- fair_leave.lua (the waiters behind it move up by W, and the new head is woken if the
-- lock is free); a holder that is not queued changes nothing.
--
-- Everything is decided before anything is written, and the message is published first:
-- a refused PUBLISH (ACL) then fails the script with nothing changed, not even the
-- tombstone. Subscribers receive the message after the script either way, and the state
-- stored is the same as in the order above.

--@include times
--@include fair_purge
--@include fair_leave_queue
check_ms(ARGV[3], ARGV[4], ARGV[8])

local now = tonumber(ARGV[5])
local function tombstone()
    redis.call('set', KEYS[5], 1, 'px', ARGV[8])
end
local function wake(head)
    redis.call(ARGV[7], KEYS[4] .. ':' .. head, ARGV[6])
end

local count = redis.call('hget', KEYS[1], ARGV[1])
if count and tonumber(count) == tonumber(ARGV[2]) then
    if tonumber(count) > 1 then
        tombstone()
        redis.call('hincrby', KEYS[1], ARGV[1], -1)
        redis.call('pexpire', KEYS[1], ARGV[3])
        return 1
    end
    local expired, head = expired_waiters(now)
    if head then
        wake(head)
    end
    tombstone()
    redis.call('del', KEYS[1])
    pop_waiters(expired)
    return 1
end
if ARGV[9] ~= '1' then
    tombstone()
    return 0
end
leave_queue(ARGV[1], tonumber(ARGV[4]), now, wake, tombstone)
return 0
