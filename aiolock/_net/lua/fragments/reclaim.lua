-- Fragment reclaim: the permits whose lease ran out go back to a permit-expirable semaphore,
-- as Redisson's scripts do first (redisson-spec-2.md 3.2).
--
-- Expects: give_permits (fragment permits), included before this one.
-- Defines:
--   reclaim(semaphore, timeouts, channel, publish, now, limit)
--     Removes up to limit (-1: all) ids whose expiry (score) is at or before now from the
--     timeouts ZSET and gives their permits back (publishing the new count).
local function reclaim(semaphore, timeouts, channel, publish, now, limit)
    local expired
    if limit < 0 then
        expired = redis.call('zrangebyscore', timeouts, 0, now)
    else
        expired = redis.call('zrangebyscore', timeouts, 0, now, 'limit', 0, limit)
    end
    -- The permits first: if they cannot be given (a count at int64's bound), nothing changed.
    if #expired > 0 then
        give_permits(semaphore, channel, #expired, publish)
    end
    -- In chunks: Lua's unpack() takes only so many values at once.
    for first = 1, #expired, 1000 do
        redis.call('zrem', timeouts, unpack(expired, first, math.min(first + 999, #expired)))
    end
end
