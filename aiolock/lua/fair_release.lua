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
local done = redis.call('get', KEYS[5])
if done then
    return tonumber(done)
end
-- The purge, read-only: the expired waiters at the head, and the head left after them.
local now = tonumber(ARGV[4])
local expired, seen = {}, {}
local head = redis.call('lindex', KEYS[2], 0)
while head do
    local deadline = tonumber(redis.call('zscore', KEYS[3], head))
    -- A popped id has no deadline left: the purge would stop at a second copy of it.
    if deadline == nil or deadline > now or seen[head] then
        break
    end
    expired[#expired + 1] = head
    seen[head] = true
    head = redis.call('lindex', KEYS[2], #expired)
end
local function purge()
    for i = 1, #expired do
        redis.call('zrem', KEYS[3], expired[i])
        redis.call('lpop', KEYS[2])
    end
end
local function wake_head()
    if head then
        redis.call(ARGV[5], KEYS[4] .. ':' .. head, ARGV[1])
    end
end

if redis.call('exists', KEYS[1]) == 0 then
    wake_head()
    purge()
    return nil
end
local count = tonumber(redis.call('hget', KEYS[1], ARGV[3]))
if not count then
    purge()
    return nil
end
if count > 1 then
    purge()
    redis.call('hincrby', KEYS[1], ARGV[3], -1)
    redis.call('pexpire', KEYS[1], ARGV[2])
    redis.call('set', KEYS[5], 0, 'px', ARGV[6])
    return 0
end
wake_head()
purge()
redis.call('del', KEYS[1])
redis.call('set', KEYS[5], 1, 'px', ARGV[6])
return 1
