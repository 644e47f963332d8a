-- Fragment fair_purge: Redisson's purge of the expired waiters at the head of a fair lock's
-- queue, which every RFairLock script runs first. It comes in two halves, a read-only scan
-- and its writes, so that a script can decide (and publish) before it writes anything.
--
-- Expects: KEYS[2] the queue and KEYS[3] the timeouts zset, as in every fair_*.lua.
-- Defines:
--   expired_waiters(now, waiter, moved) -> expired, head
--     The ids the purge pops, in order, and the head it leaves (false or nil: none).
--     waiter(i) is the queue's i-th id (default: the stored queue); moved[id], if given,
--     is taken off id's stored deadline, so the scan can run on the queue as it is about
--     to become rather than as it is.
--   pop_waiters(expired): the purge's writes.
local function expired_waiters(now, waiter, moved)
    waiter = waiter or function(i)
        return redis.call('lindex', KEYS[2], i - 1)
    end
    local expired, seen = {}, {}
    local head = waiter(1)
    while head do
        local deadline = tonumber(redis.call('zscore', KEYS[3], head))
        if moved and moved[head] then
            deadline = (deadline or 0) - moved[head]
        end
        -- A popped id has no deadline left: the purge would stop at a second copy of it.
        if deadline == nil or deadline > now or seen[head] then
            break
        end
        expired[#expired + 1] = head
        seen[head] = true
        head = waiter(#expired + 1)
    end
    return expired, head
end

local function pop_waiters(expired)
    for i = 1, #expired do
        redis.call('zrem', KEYS[3], expired[i])
        redis.call('lpop', KEYS[2])
    end
end
