-- Fragment forced: what a force_unlock finds at the lock's key before it deletes anything.
--
-- Expects: nothing (the key is an argument).
-- Defines:
--   refuse_force(key) -> nil if key holds a hash (a lock to delete), else the reply
--     0 if there is no key, or a WRONGTYPE error reply if it holds another type: that is
--     somebody's data, not a lock, and the script returns it with nothing changed
--     (Redisson deletes it all the same).
local function refuse_force(key)
    local kind = redis.call('type', key).ok
    if kind == 'none' then
        return 0
    end
    if kind ~= 'hash' then
        return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
    end
    return nil
end
