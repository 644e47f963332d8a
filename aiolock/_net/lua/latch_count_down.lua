-- Count a count-down latch down by one: Redisson RCountDownLatch countDown.
--
-- KEYS[1]  the latch: its count (absent: 0, open)
-- KEYS[2]  the latch's channel "redisson_countdownlatch__channel__{name}"
-- KEYS[3]  this call's latch key "redisson_unlock_latch:{name}:<request id>"
-- ARGV[1]  publish command: PUBLISH or SPUBLISH
-- ARGV[2]  latch key TTL in ms
--
-- Returns 1. The count goes down by one; at 0 the key is deleted and "0" published (the
-- latch opens, waking its waiters). An open latch stays open, and nothing is published
-- again. A resend of the same call replays the latch key and counts nothing twice
-- (Redisson's countDown is never resent, so a lost reply leaves the caller unsure).

--@include times
--@include latch
check_ms(ARGV[2])

local function count_down()
    local count = tonumber(redis.call('get', KEYS[1]))
    if not count then
        return 1
    end
    if count - 1 == 0 then
        redis.call(ARGV[1], KEYS[2], '0')
    end
    if count - 1 <= 0 then
        redis.call('del', KEYS[1])
    else
        redis.call('decr', KEYS[1])
    end
    return 1
end
return latched(KEYS[3], ARGV[2], count_down)
