-- Whether the read side of a read-write lock is held: Redisson readLock().isLocked().
--
-- KEYS[1]  lock hash
-- ARGV[]   none
--
-- Returns 1 if mode=read, or mode=write with read holds besides the writer's field (a
-- writer that also took the read lock: more than "mode" and one write field), else 0.
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == 'read' or (mode == 'write' and redis.call('hlen', KEYS[1]) > 2) then
    return 1
end
return 0
