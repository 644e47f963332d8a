-- Set a permit-expirable semaphore's total of permits, those taken included: Redisson
-- RPermitExpirableSemaphore setPermits (redisson-spec-2.md 3.4).
--
-- KEYS[1]  the semaphore: the number of permits available
-- KEYS[2]  "{name}:timeout": ZSET of the ids taken
-- KEYS[3]  the semaphore's channel "redisson_sc:{name}"
-- KEYS[4]  this call's latch "redisson_unlock_latch:{name}:<request id>"
-- ARGV[1]  the new total (>= 0)
-- ARGV[2]  publish command: PUBLISH or SPUBLISH
-- ARGV[3]  latch TTL in ms
--
-- Returns 1. As Redisson's: an absent key is SET to the total; else the available count
-- becomes the total minus the permits taken (every id in the ZSET, expired or not: an
-- expired one is reclaimed into the count later, which keeps the total), keeping the key's
-- TTL (Redisson's INCRBY does). When the total changed, the total is published (not the
-- available count: receivers read any count as "try again"). The available count may go
-- negative (more taken than the new total): nobody gets a permit until enough come back.
-- A resend of the same call replays the latch.

--@include times
--@include counts
--@include latch
check_ms(ARGV[3])
check_count(ARGV[1], false)

local function set_permits()
    local before = redis.call('get', KEYS[1])
    if not before then
        redis.call(ARGV[2], KEYS[3], ARGV[1])
        redis.call('set', KEYS[1], ARGV[1])
        return 1
    end
    local taken = redis.call('zcount', KEYS[2], 0, '+inf')
    -- total - taken, computed by Redis on the exact integers (Lua's numbers are doubles):
    -- total >= 0 and taken >= 0, so neither step can overflow.
    redis.call('set', KEYS[1], ARGV[1], 'keepttl')
    redis.call('decrby', KEYS[1], taken)
    if redis.call('get', KEYS[1]) ~= before then
        local published = redis.pcall(ARGV[2], KEYS[3], ARGV[1])
        if type(published) == 'table' and published.err then
            redis.call('set', KEYS[1], before, 'keepttl')
            error(published)
        end
    end
    return 1
end
return latched(KEYS[4], ARGV[3], set_permits)
