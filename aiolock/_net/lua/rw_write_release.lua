-- Release one write hold of a read-write lock: Redisson write unlock, with the unlock latch.
--
-- KEYS[1]  lock hash
-- KEYS[2]  channel "redisson_rwlock:{name}"
-- KEYS[3]  unlock latch "redisson_unlock_latch:{name}:<request id>"
-- ARGV[1]  write unlock message "1"
-- ARGV[2]  lease in ms to re-apply while write holds remain
-- ARGV[3]  write field "<holder>:write"
-- ARGV[4]  publish command: PUBLISH or SPUBLISH
-- ARGV[5]  latch TTL in ms
-- ARGV[6]  (optional) write field of a waiter of this client to hand the lock to, if this
--          release would free it
-- ARGV[7]  (optional) that waiter's lease in ms
--
-- Returns nil if the holder has no write hold, 0 if write holds remain, 1 if the lock was
-- released (deleted, and "1" published), 2 if the write hold was released but this
-- holder's read holds remain: the lock is downgraded to mode=read and, as in Redisson,
-- NOTHING is published, 3 if the last write hold went straight to ARGV[6] (one write
-- hold, lease ARGV[7], mode still "write"; nothing published: the lock was never free).
-- A resend of the same call replays the first result from the latch.
--
-- Redisson semantics (spec 6.5); an unlock of a lock with no mode publishes "1" (a wake-up)
-- and reports "not held". Unlike Redisson, nothing is written to the latch on a nil reply.
--
-- The message is published before anything is written: a refused PUBLISH (ACL) then fails
-- the script with the hold still there, as the caller's bookkeeping assumes after an
-- error. Subscribers receive it after the script either way.

--@include times
--@include latch
--@include hold
--@include rw_unlock_mode
--@include rw_write_unlock
--@include hand_over
check_ms(ARGV[2], ARGV[5], ARGV[7] or '1')

local function free()
    -- Handed over only where the release would free the lock: "mode" and this write
    -- field alone (no read hold of anyone, the heir's included, would be left behind).
    if ARGV[6] and redis.call('hlen', KEYS[1]) == 2 then
        hand_over(KEYS[1], ARGV[3], ARGV[6], ARGV[7])
        return 3
    end
    return free_write(ARGV[3], ARGV[4], ARGV[1])
end
local function release()
    if unlock_mode(ARGV[4], ARGV[1]) ~= 'write' then
        return nil
    end
    return release_hold(KEYS[1], ARGV[3], ARGV[2], free)
end
return latched(KEYS[3], ARGV[5], release)
