-- Fragment fair_leave_queue: a waiter leaves a fair lock's queue (Redisson RFairLock
-- acquireFailed), then the purge runs and, if the head changed while the lock is free, the
-- new head is woken.
--
-- Expects: KEYS[1] the lock hash, KEYS[2] the queue, KEYS[3] the timeouts (as in every
-- fair_*.lua), and the functions of fair_purge.lua, included before this fragment.
-- Defines:
--   leave_queue(holder, w, now, wake, before_writes) -> true if holder was queued
--     w is the W its acquire calls were sent with; wake(head) publishes to that waiter;
--     before_writes(), if given, runs after the publish and before the first write.
local function leave_queue(holder, w, now, wake, before_writes)
    local queue = redis.call('lrange', KEYS[2], 0, -1)
    local at = 1
    while at <= #queue and queue[at] ~= holder do
        at = at + 1
    end
    if at > #queue then
        if before_writes then
            before_writes()
        end
        -- Not queued; drop a stray deadline all the same, as Redisson does.
        redis.call('zrem', KEYS[3], holder)
        return false
    end

    -- Everything is decided before anything is written, so a refused PUBLISH (ACL) fails
    -- the script with nothing changed. Every waiter behind the holder moves up by W: their
    -- deadlines were counted from its deadline, which was counted with W. The purge then
    -- scans the queue as it will be once the holder has left and those deadlines moved.
    local moved, rest = {}, {}
    for i = at + 1, #queue do
        moved[queue[i]] = (moved[queue[i]] or 0) + w
    end
    for i = 1, #queue do
        if queue[i] ~= holder then
            rest[#rest + 1] = queue[i]
        end
    end
    local expired, head = expired_waiters(now, function(i)
        return rest[i]
    end, moved)
    -- A holder that gave up right after the release was published to it would otherwise
    -- leave the next waiter asleep until its wait bound.
    if (at == 1 or #expired > 0) and head and redis.call('exists', KEYS[1]) == 0 then
        wake(head)
    end

    if before_writes then
        before_writes()
    end
    for i = at + 1, #queue do
        redis.call('zincrby', KEYS[3], -w, queue[i])
    end
    redis.call('zrem', KEYS[3], holder)
    redis.call('lrem', KEYS[2], 0, holder)
    pop_waiters(expired)
    return true
end
