-- Fragment frw_settle: the fair read-write lock's mode once holds went.
--
-- The lock's layout: a hold is a field of the state hash, "r:<holder>" (read) or
-- "w:<holder>" (write), with its reentrancy count, and a score in the leases ZSET: when
-- its lease ends. A waiter is the same string in the queue LIST (arrival order) and in the
-- deadlines ZSET: when it is dropped unless it tries again before. A reader let in with
-- the readers at the head of the queue leaves the list for the admitted ZSET (same score
-- as its deadline) until it takes its hold (see frw_admit.lua). "mode" in the state hash
-- is "write" while a write hold remains, else "read" while a read hold does; a lock with
-- no hold is deleted.
--
-- Expects: nothing (keys and values are arguments).
-- Defines:
--   frw_settle(state, leases, writer_went) -> "freed", "read" or "write": the mode once
--     holds went (the lock deleted when none is left); writer_went: a "w:" field was among
--     them. A write hold excludes every hold but its own holder's read hold, so once it
--     goes what is left is read holds: no need to look at the fields (O(1) in the holders).
local function frw_settle(state, leases, writer_went)
    if redis.call('hlen', state) - redis.call('hexists', state, 'mode') <= 0 then
        redis.call('del', state, leases)
        return 'freed'
    end
    if writer_went then
        redis.call('hset', state, 'mode', 'read')
        return 'read'
    end
    return redis.call('hget', state, 'mode')
end
