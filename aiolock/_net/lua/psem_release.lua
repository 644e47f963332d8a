-- Give back one permit of a permit-expirable semaphore by its id: Redisson tryRelease(id).
--
-- KEYS[1]  the semaphore
-- KEYS[2]  "{name}:timeout"
-- KEYS[3]  the semaphore's channel "redisson_sc:{name}"
-- KEYS[4]  this call's latch "redisson_unlock_latch:{name}:<request id>"
-- ARGV[1]  the id (16 raw bytes)
-- ARGV[2]  the "never expires" score
-- ARGV[3]  publish command: PUBLISH or SPUBLISH
-- ARGV[4]  latch TTL in ms
--
-- Returns 1 if the id held a permit and it is back (the new count published), 2 if so but
-- its lease had run out (the permit comes back once all the same, as in Redisson), 0 if
-- the id holds no permit (unknown, released, or reclaimed after it ran out). A resend of
-- the same call replays the first answer: a release that landed is not "unknown" later.

--@include times
--@include latch
--@include permits
--@include clock
--@include reclaim
check_ms(ARGV[4])

local function release()
    local expiry = redis.call('zscore', KEYS[2], ARGV[1])
    if not expiry then
        return 0
    end
    local now = server_ms()
    -- The permit first: if it cannot be given (a count at int64's bound), nothing changed.
    give_permits(KEYS[1], KEYS[3], 1, ARGV[3])
    redis.call('zrem', KEYS[2], ARGV[1])
    reclaim(KEYS[1], KEYS[2], KEYS[3], ARGV[3], now, -1)
    if expiry ~= ARGV[2] and tonumber(expiry) <= now then
        return 2
    end
    return 1
end
return latched(KEYS[4], ARGV[4], release)
