-- Fragment rw_write_unlock: the last write hold of a read-write lock given back, as
-- Redisson's write unlock does it (spec 6.5).
--
-- Expects: KEYS[1] the lock hash and KEYS[2] the channel "redisson_rwlock:{name}", as in
-- rw_write_release.lua.
-- Defines:
--   free_write(field, publish, message) -> 1 or 2
--     1: the lock is deleted and message published by the publish command. 2: the holder's
--     read holds remain, so only its write field goes and the lock is downgraded to
--     mode=read; as in Redisson, nothing is published.
local function free_write(field, publish, message)
    if redis.call('hlen', KEYS[1]) == 2 then
        -- "mode" and this write field only: nothing holds the lock once the field goes.
        redis.call(publish, KEYS[2], message)
        redis.call('del', KEYS[1])
        return 1
    end
    redis.call('hdel', KEYS[1], field)
    redis.call('hset', KEYS[1], 'mode', 'read')
    return 2
end
