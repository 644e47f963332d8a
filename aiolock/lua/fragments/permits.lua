-- Fragment permits: permits given to a semaphore, as Redisson's release gives them.
--
-- Expects: nothing (keys and values are arguments).
-- Defines:
--   give_permits(semaphore, channel, permits, publish)
--     Adds permits (INCRBY: a TTL stays) and, if the new count is above 0, publishes it on
--     channel with the publish command: Redisson's receivers read it as "wake up to this
--     many". Published before anything is written, so that a refused PUBLISH changes
--     nothing.
local function give_permits(semaphore, channel, permits, publish)
    local available = (tonumber(redis.call('get', semaphore)) or 0) + tonumber(permits)
    if available > 0 then
        redis.call(publish, channel, available)
    end
    redis.call('incrby', semaphore, permits)
end
