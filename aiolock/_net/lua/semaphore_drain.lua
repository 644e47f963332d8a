-- Take every available permit of a semaphore: Redisson RSemaphore drainPermits.
--
-- KEYS[1]  the semaphore: the number of permits available
-- KEYS[2]  this attempt's receipt: "drained:<count>" once it drained, "void" once rolled back
-- ARGV[1]  receipt TTL in ms
--
-- Returns {1, count}: the permits it took, as the decimal string the key held ("0" if the
-- key was absent; negative if add_permits took more than there were: the count is then
-- 0, as in Redisson), or {0, "0"} if the attempt was rolled back already.
--
-- As Redisson's, it rewrites the key with SET, which drops a TTL; an absent key stays
-- absent. A resend finds the receipt and answers the first count again, taking nothing
-- more (Redisson's, resent, answers 0); semaphore_undrain.lua gives the count back.

--@include times
check_ms(ARGV[1])

local receipt = redis.call('get', KEYS[2])
if receipt then
    if string.sub(receipt, 1, 8) == 'drained:' then
        return {1, string.sub(receipt, 9)}
    end
    return {0, '0'}
end
local available = redis.call('get', KEYS[1])
if not available then
    available = '0'
else
    redis.call('set', KEYS[1], 0)
end
redis.call('set', KEYS[2], 'drained:' .. available, 'px', ARGV[1])
return {1, available}
