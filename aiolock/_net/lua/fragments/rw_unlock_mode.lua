-- Fragment rw_unlock_mode: what an unlock of either side of a read-write lock reads first.
--
-- Expects: KEYS[1] the lock hash and KEYS[2] the channel "redisson_rwlock:{name}", as in
-- rw_read_release.lua and rw_write_release.lua.
-- Defines:
--   unlock_mode(publish, message) -> the lock's "mode" field, or false
--     With no mode there is no lock, so nothing is held; as in Redisson, message is
--     published all the same (by the publish command): a wake-up for waiters that missed
--     the release, or slept through a lease that ran out.
local function unlock_mode(publish, message)
    local mode = redis.call('hget', KEYS[1], 'mode')
    if mode == false then
        redis.call(publish, KEYS[2], message)
    end
    return mode
end
