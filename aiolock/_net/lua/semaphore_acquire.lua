-- Take permits of a semaphore: Redisson RSemaphore layout (a string of available permits).
--
-- KEYS[1]  the semaphore: the number of permits available
-- KEYS[2]  this attempt's receipt: "taken" once it took, "void" once rolled back
-- ARGV[1]  permits to take (>= 1)
-- ARGV[2]  receipt TTL in ms
-- ARGV[3]  the permits the semaphore is declared with ('' if none): set first if it has no
--          state (seed.lua)
--
-- Returns {1, left} if the permits were taken (left: the permits available after the take,
-- which the caller's client wakes that many of its waiters for), {0, available} if fewer
-- are available (nothing changes), {0, 0} if the attempt was rolled back already.
--
-- Redisson's tryAcquire has no receipt: a resend of one whose reply was lost takes the
-- permits twice. Here a resend finds the receipt and answers 1 again without taking more,
-- and a rollback (semaphore_rollback.lua) knows from it whether there is anything to
-- give back. The semaphore's value is exactly Redisson's.

--@include times
--@include counts
--@include seed

check_ms(ARGV[2])
check_count(ARGV[1], false)
local receipt = redis.call('get', KEYS[2])
if receipt then
    if receipt == 'taken' then
        -- A resend: what is left now, as the first send would have said.
        return {1, math.max(0, tonumber(redis.call('get', KEYS[1])) or 0)}
    end
    return {0, 0}
end
seed_permits(KEYS[1], ARGV[3])
local available = tonumber(redis.call('get', KEYS[1])) or 0
if available < tonumber(ARGV[1]) then
    return {0, available}
end
local left = redis.call('decrby', KEYS[1], ARGV[1])
redis.call('set', KEYS[2], 'taken', 'px', ARGV[2])
return {1, left}
