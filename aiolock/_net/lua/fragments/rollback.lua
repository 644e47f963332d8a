-- Fragment rollback: the undoing of an acquire call whose reply never arrived, and the
-- tombstone that voids any copy of it that reaches the server later.
--
-- Expects: nothing (keys and values are arguments).
-- Defines:
--   rolled_back(hash, field, target, tombstone, ttl, give_back) -> 1 or 0
--     An acquire only ever takes a hold from target - 1 to target, so finding field at the
--     target count means that call took it: give_back(count) returns the hold, and the
--     reply is 1; otherwise nothing is given back and the reply is 0. The tombstone is
--     written either way, for ttl ms, after everything else.
local function rolled_back(hash, field, target, tombstone, ttl, give_back)
    local count = redis.call('hget', hash, field)
    local taken = count and tonumber(count) == tonumber(target)
    if taken then
        give_back(tonumber(count))
    end
    redis.call('set', tombstone, 1, 'px', ttl)
    if taken then
        return 1
    end
    return 0
end
