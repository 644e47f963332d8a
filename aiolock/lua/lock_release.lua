-- Release one hold of a reentrant lock: Redisson RLock unlock, with the unlock latch.
--
-- KEYS[1]  lock hash
-- KEYS[2]  lock channel "redisson_lock__channel:{name}"
-- KEYS[3]  unlock latch "redisson_unlock_latch:{name}:<request id>"
-- ARGV[1]  unlock message "0"
-- ARGV[2]  lease in ms to re-apply while holds remain
-- ARGV[3]  holder id
-- ARGV[4]  publish command: PUBLISH or SPUBLISH
-- ARGV[5]  latch TTL in ms
--
-- Returns nil if the holder has no hold, 0 if holds remain, 1 if the lock was released
-- (then ARGV[1] was published on KEYS[2]). A resend of the same call (same request id)
-- replays the first result from the latch instead of decrementing again.
--
-- The message is published before anything is written: a refused PUBLISH (ACL) then fails
-- the script with the hold still there, as the caller's bookkeeping assumes after an
-- error. Subscribers receive it after the script either way.

--@include latch
--@include hold

local function free()
    redis.call(ARGV[4], KEYS[2], ARGV[1])
    redis.call('del', KEYS[1])
    return 1
end
local function release()
    return release_hold(KEYS[1], ARGV[3], ARGV[2], free)
end
return latched(KEYS[3], ARGV[5], release)
