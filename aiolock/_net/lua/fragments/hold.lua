-- Fragment hold: one hold of a reentrant hash lock given back, as Redisson's unlock does it:
-- the count goes down while more holds remain, and the last one frees the lock.
--
-- Expects: nothing (keys and values are arguments).
-- Defines:
--   release_hold(hash, field, lease, free) -> nil, 0 or what free() returns
--     nil if field has no hold; 0 if it had more than one (one is dropped and the hash gets
--     the lease again); else free() runs, which frees the lock in its own way (delete and
--     publish, or downgrade) and gives the reply.
local function release_hold(hash, field, lease, free)
    local count = tonumber(redis.call('hget', hash, field))
    if not count then
        return nil
    end
    if count > 1 then
        redis.call('hincrby', hash, field, -1)
        redis.call('pexpire', hash, lease)
        return 0
    end
    return free()
end
