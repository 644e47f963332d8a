-- Release one hold of a fair read-write lock.
--
-- KEYS[1]  state, KEYS[2] leases, KEYS[3] queue, KEYS[4] deadlines (see frw_acquire.lua)
-- KEYS[5]  channel "aiolock_frw__channel:{name}"
-- KEYS[6]  unlock latch "redisson_unlock_latch:{name}:<request id>"
-- ARGV[1]  the field: "r:<holder>" or "w:<holder>"
-- ARGV[2]  lease in ms to re-apply while holds of the field remain
-- ARGV[3]  publish command: PUBLISH or SPUBLISH
-- ARGV[4]  latch TTL in ms
--
-- Returns nil if the field has no hold, 0 if holds of it remain, 1 if its last hold went,
-- 2 if that was a write hold and the holder's read holds remain (the lock is in read mode
-- now). When the lock frees, or turns from write to read, "1" is published: the waiters at
-- the head may get in. A resend of the same call replays the first result from the latch.

--@include times
--@include clock
--@include frw_settle
--@include latch
check_ms(ARGV[2], ARGV[4])

local function release()
    local count = tonumber(redis.call('hget', KEYS[1], ARGV[1]))
    if not count then
        return nil
    end
    if count > 1 then
        redis.call('hincrby', KEYS[1], ARGV[1], -1)
        redis.call('zadd', KEYS[2], server_ms() + tonumber(ARGV[2]), ARGV[1])
        return 0
    end
    redis.call(ARGV[3], KEYS[5], '1')
    redis.call('hdel', KEYS[1], ARGV[1])
    redis.call('zrem', KEYS[2], ARGV[1])
    local mode = frw_settle(KEYS[1], KEYS[2], string.sub(ARGV[1], 1, 2) == 'w:')
    if mode == 'read' and string.sub(ARGV[1], 1, 2) == 'w:' then
        return 2
    end
    return 1
end
return latched(KEYS[6], ARGV[4], release)
