-- Fragment settled: the answers an acquire gives before it looks at the lock, from the
-- count its caller believes it has (see lock_acquire.lua).
--
-- Expects: nothing (keys and values are arguments).
-- Defines:
--   settled(hash, field, target, lease) -> reply or nil, count
--     {1, target} if field already has the target count: a copy of this call took the hold
--     before, so nothing is taken twice (the hash gets the lease again if one is given, as
--     RLock does on re-entry); {-2, count} if field's count is not target - 1: the caller
--     lost a hold without knowing, and takes nothing. Otherwise nil, and the count as
--     stored (false: none) for the call to go on with.
local function settled(hash, field, target, lease)
    local count = redis.call('hget', hash, field)
    if count and tonumber(count) == tonumber(target) then
        if lease then
            redis.call('pexpire', hash, lease)
        end
        return {1, tonumber(count)}, count
    end
    if (tonumber(count) or 0) ~= tonumber(target) - 1 then
        return {-2, tonumber(count) or 0}, count
    end
    return nil, count
end
