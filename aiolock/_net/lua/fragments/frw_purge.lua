-- Fragment frw_purge: what ran out in a fair read-write lock (see frw_settle.lua).
--
-- Expects: frw_settle (fragment frw_settle), included before this one.
-- Defines:
--   frw_purge(state, leases, queue, deadlines, now) -> true if anything was purged: the
--     holds whose lease ran out and the waiters not seen in time (dead clients)
local function frw_purge(state, leases, queue, deadlines, now)
    local purged = false
    local expired = redis.call('zrangebyscore', leases, 0, now)
    if #expired > 0 then
        redis.call('hdel', state, unpack(expired))
        redis.call('zrem', leases, unpack(expired))
        frw_settle(state, leases)
        purged = true
    end
    local dead = redis.call('zrangebyscore', deadlines, 0, now)
    for i = 1, #dead do
        redis.call('lrem', queue, 0, dead[i])
        redis.call('zrem', deadlines, dead[i])
        purged = true
    end
    return purged
end
