-- Fragment permits: permits given to a semaphore, as Redisson's release gives them.
--
-- Expects: nothing (keys and values are arguments).
-- Defines:
--   give_permits(semaphore, channel, permits, publish)
--     Adds permits (INCRBY: a TTL stays) and, if the new count is above 0, publishes it on
--     channel with the publish command: Redisson's receivers read it as "wake up to this
--     many". Either both happen or neither: an INCRBY that would overflow int64 fails
--     before anything is written or published, and a refused PUBLISH takes the permits
--     back before the script fails with its error.
local function give_permits(semaphore, channel, permits, publish)
    local available = redis.call('incrby', semaphore, permits)
    if available > 0 then
        local published = redis.pcall(publish, channel, available)
        if type(published) == 'table' and published.err then
            -- permits is never -2**63 here (the count would be below 1): DECRBY can take it.
            redis.call('decrby', semaphore, permits)
            error(published)
        end
    end
end
