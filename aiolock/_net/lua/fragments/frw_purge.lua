-- Fragment frw_purge: what ran out in a fair read-write lock (see frw_settle.lua).
--
-- Expects: frw_settle (fragment frw_settle), included before this one.
-- Defines:
--   frw_purge(state, leases, queue, deadlines, admitted, now) -> true if anything was
--     purged: the holds whose lease ran out, the waiters not seen in time (dead clients)
--     and the admitted entries past their deadline. Work is per entry purged, never per
--     waiter queued, except that a dead waiter still in the list is found by LREM (once).
local function frw_purge(state, leases, queue, deadlines, admitted, now)
    local purged = false
    local expired = redis.call('zrangebyscore', leases, 0, now)
    if #expired > 0 then
        redis.call('hdel', state, unpack(expired))
        redis.call('zrem', leases, unpack(expired))
        local writer_went = false
        for i = 1, #expired do
            writer_went = writer_went or string.sub(expired[i], 1, 2) == 'w:'
        end
        frw_settle(state, leases, writer_went)
        purged = true
    end
    local dead = redis.call('zrangebyscore', deadlines, 0, now)
    for i = 1, #dead do
        redis.call('zrem', deadlines, dead[i])
        if redis.call('zrem', admitted, dead[i]) == 0 then
            redis.call('lrem', queue, 0, dead[i])
        end
        purged = true
    end
    -- An entry admitted for a reader of an older aiolock, which knows nothing of this set
    -- and so never refreshes nor removes it, lapses here.
    local lapsed = redis.call('zrangebyscore', admitted, 0, now)
    if #lapsed > 0 then
        redis.call('zrem', admitted, unpack(lapsed))
        purged = true
    end
    return purged
end
