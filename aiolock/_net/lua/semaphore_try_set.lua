-- Set a semaphore's permits if it has none yet: Redisson RSemaphore trySetPermits.
--
-- KEYS[1]  the semaphore
-- KEYS[2]  the semaphore's channel "redisson_sc:{name}"
-- KEYS[3]  this call's latch "redisson_unlock_latch:{name}:<request id>"
-- ARGV[1]  permits (>= 0)
-- ARGV[2]  publish command: PUBLISH or SPUBLISH
-- ARGV[3]  latch TTL in ms
--
-- Returns 1 if the key was absent and now holds ARGV[1] (published, as Redisson does),
-- 0 if it existed (nothing changes). A resend of the same call replays the first answer:
-- without the latch, a resend of a call that set the permits would answer 0.

--@include times
--@include counts
--@include latch
check_ms(ARGV[3])
check_count(ARGV[1], false)

local function try_set()
    if redis.call('exists', KEYS[1]) == 1 then
        return 0
    end
    redis.call(ARGV[2], KEYS[2], ARGV[1])
    redis.call('set', KEYS[1], ARGV[1])
    return 1
end
return latched(KEYS[3], ARGV[3], try_set)
