-- Take permits of a permit-expirable semaphore: Redisson RPermitExpirableSemaphore layout.
--
-- KEYS[1]  the semaphore: the number of permits available
-- KEYS[2]  "{name}:timeout": ZSET of the ids taken (16 raw bytes) -> expiry in epoch ms
-- KEYS[3]  the semaphore's channel "redisson_sc:{name}"
-- KEYS[4]  this attempt's tombstone (written by psem_rollback.lua)
-- ARGV[1]  lease in ms, or -1: the permits never expire
-- ARGV[2]  the "never expires" score, 922337203685477 (Redisson's)
-- ARGV[3]  publish command: PUBLISH or SPUBLISH
-- ARGV[4]  the permits the semaphore is declared with ('' if none): set first if it has no
--          state (seed.lua)
-- ARGV[5…] the ids of this attempt, one per permit (fresh per attempt)
--
-- Returns {1} when the permits were taken (each id scored with its expiry), {0, ms} when
-- too few are available and the earliest permit taken expires in ms, {0, -1} when none
-- will expire by itself (or this attempt was rolled back already).
--
-- Expired permits go back first (as Redisson's acquire does, up to as many as asked for).
-- A resend of an attempt that took finds its first id scored and answers {1} again. Expiry
-- is the server's clock plus the lease (Redisson uses each client's clock); the ZSET gets
-- the semaphore's TTL if it has one, as in Redisson.

--@include times
--@include counts
--@include seed
--@include permits
--@include clock
--@include reclaim
if ARGV[1] ~= '-1' then
    check_ms(ARGV[1])
end

local wanted = #ARGV - 4
if redis.call('zscore', KEYS[2], ARGV[5]) then
    return {1}
end
if redis.call('exists', KEYS[4]) == 1 then
    return {0, -1}
end
seed_permits(KEYS[1], ARGV[4])
local now = server_ms()
reclaim(KEYS[1], KEYS[2], KEYS[3], ARGV[3], now, wanted)
local available = tonumber(redis.call('get', KEYS[1]))
if available and available >= wanted then
    local expiry = ARGV[2]
    if tonumber(ARGV[1]) >= 0 then
        expiry = now + tonumber(ARGV[1])
    end
    redis.call('decrby', KEYS[1], wanted)
    for i = 5, #ARGV do
        redis.call('zadd', KEYS[2], expiry, ARGV[i])
    end
    local ttl = redis.call('pttl', KEYS[1])
    if ttl > 0 then
        redis.call('pexpire', KEYS[2], ttl)
    end
    return {1}
end
local first = redis.call('zrange', KEYS[2], 0, 0, 'withscores')
if first[2] and first[2] ~= ARGV[2] then
    return {0, math.max(0, tonumber(first[2]) - now)}
end
return {0, -1}
