-- Release one hold of a reentrant lock: Redisson RLock unlock, with the unlock latch, and an
-- optional hand-over to a waiter of the releasing client.
--
-- KEYS[1]  lock hash
-- KEYS[2]  lock channel "redisson_lock__channel:{name}"
-- KEYS[3]  unlock latch "redisson_unlock_latch:{name}:<request id>"
-- ARGV[1]  unlock message "0"
-- ARGV[2]  lease in ms to re-apply while holds remain
-- ARGV[3]  holder id
-- ARGV[4]  publish command: PUBLISH or SPUBLISH, or '' for none (the spin lock)
-- ARGV[5]  latch TTL in ms
-- ARGV[6]  (optional) holder id to hand the lock to, if this release frees it
-- ARGV[7]  (optional) that holder's lease in ms
--
-- Returns nil if the holder has no hold, 0 if holds remain, 1 if the lock was released
-- (then ARGV[1] was published on KEYS[2]), 3 if the holder's last hold went straight to
-- ARGV[6] (one hold, lease ARGV[7]; nothing published: the lock was never free, so there
-- is nothing for other waiters to try for). A resend of the same call (same request id)
-- replays the first result from the latch instead of decrementing again.
--
-- The message is published before anything is written: a refused PUBLISH (ACL) then fails
-- the script with the hold still there, as the caller's bookkeeping assumes after an
-- error. Subscribers receive it after the script either way.

--@include times
--@include latch
--@include hold
--@include notify
check_ms(ARGV[2], ARGV[5], ARGV[7] or '1')

local function free()
    local heir = ARGV[6]
    -- An heir with a hold of its own would be the client's mistake: then no hand-over.
    if heir and redis.call('hexists', KEYS[1], heir) == 0 then
        redis.call('hdel', KEYS[1], ARGV[3])
        redis.call('hset', KEYS[1], heir, 1)
        redis.call('pexpire', KEYS[1], ARGV[7])
        return 3
    end
    notify(ARGV[4], KEYS[2], ARGV[1])
    redis.call('del', KEYS[1])
    return 1
end
local function release()
    return release_hold(KEYS[1], ARGV[3], ARGV[2], free)
end
return latched(KEYS[3], ARGV[5], release)
