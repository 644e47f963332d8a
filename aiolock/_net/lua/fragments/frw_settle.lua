-- Fragment frw_settle: the fair read-write lock's mode once holds went.
--
-- The lock's layout: a hold is a field of the state hash, "r:<holder>" (read) or
-- "w:<holder>" (write), with its reentrancy count, and a score in the leases ZSET: when
-- its lease ends. A waiter is the same string in the queue LIST (arrival order) and in the
-- deadlines ZSET: when it is dropped unless it tries again before. "mode" in the state
-- hash is "write" while a write hold remains, else "read" while a read hold does; a lock
-- with no hold is deleted.
--
-- Expects: nothing (keys and values are arguments).
-- Defines:
--   frw_settle(state, leases) -> "freed", "read" or "write": the mode once holds went (the
--     lock deleted when none is left)
local function frw_settle(state, leases)
    local fields = redis.call('hkeys', state)
    local mode = false
    for i = 1, #fields do
        local side = string.sub(fields[i], 1, 2)
        if side == 'w:' then
            mode = 'write'
            break
        elseif side == 'r:' then
            mode = 'read'
        end
    end
    if not mode then
        redis.call('del', state, leases)
        return 'freed'
    end
    redis.call('hset', state, 'mode', mode)
    return mode
end
