-- Set a count-down latch's count if it is open: Redisson RCountDownLatch trySetCount.
--
-- KEYS[1]  the latch: its count (absent: 0, open)
-- KEYS[2]  the latch's channel "redisson_countdownlatch__channel__{name}"
-- KEYS[3]  this call's latch key "redisson_unlock_latch:{name}:<request id>"
-- ARGV[1]  the count (>= 0)
-- ARGV[2]  publish command: PUBLISH or SPUBLISH
-- ARGV[3]  latch key TTL in ms
--
-- Returns 1 if the latch was open and is now set (publishing "1", Redisson's "count
-- set"), 0 if it was counting (nothing changes). A count of 0 stores nothing: the latch
-- stays open, where Redisson would store a "0" that then refuses every later count. A
-- resend of the same call replays the first answer.

--@include times
--@include counts
--@include latch
check_ms(ARGV[3])
check_count(ARGV[1], false)

local function try_set()
    if redis.call('exists', KEYS[1]) == 1 then
        return 0
    end
    if tonumber(ARGV[1]) > 0 then
        redis.call(ARGV[2], KEYS[2], '1')
        redis.call('set', KEYS[1], ARGV[1])
    end
    return 1
end
return latched(KEYS[3], ARGV[3], try_set)
