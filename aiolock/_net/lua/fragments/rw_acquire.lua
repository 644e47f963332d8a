-- Fragment rw_acquire: the checks that come first in either acquire of a read-write lock,
-- in their order: the call's tombstone, then the count the caller believes it has.
--
-- Expects: KEYS[1] the lock hash, as in rw_read_acquire.lua and rw_write_acquire.lua, and
-- the function of settled.lua, included before this fragment.
-- Defines:
--   rw_acquire(tombstone, field, target, take) -> reply
--     {-1, 0} if the tombstone exists (this call was cancelled and rolled back already),
--     else the reply of settled() if it has one, else take(mode, count): the lock's "mode"
--     field (false: none) and field's count as stored (false: none) decide.
--     A first hold (target 1) on a free lock, for a call not rolled back, is the common
--     case: one EXISTS over the hash and the tombstone answers what the three calls below
--     would, as in lock_acquire.lua.
local function rw_acquire(tombstone, field, target, take)
    if target == '1' and redis.call('exists', KEYS[1], tombstone) == 0 then
        return take(false, false)
    end
    if redis.call('exists', tombstone) == 1 then
        return {-1, 0}
    end
    local reply, count = settled(KEYS[1], field, target)
    if reply then
        return reply
    end
    return take(redis.call('hget', KEYS[1], 'mode'), count)
end
