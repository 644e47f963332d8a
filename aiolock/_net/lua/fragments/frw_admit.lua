-- Fragment frw_admit: let in the readers at the head of a fair read-write lock's queue.
--
-- Readers with no writer ahead of them in the queue share the lock. Rather than each of
-- them scanning the queue for a writer ahead (O(queue) per attempt), the first one to try
-- pops the readers at the head into the admitted ZSET (score: each one's deadline), where
-- each finds itself in O(1) (ZSCORE) on its next attempt. Each waiter is popped once, and
-- one call pops at most FRW_ADMIT_MAX (the next call goes on): O(1) per attempt in the
-- queue length. A writer is let in only once no admitted reader is left (frw_admitted).
--
-- Expects: nothing (keys and values are arguments).
-- Defines:
--   frw_admit(queue, deadlines, admitted, field) -> self_in, others_in: field was among the
--     readers popped (it is no longer in the list nor in the admitted set), others were
--   frw_admitted(admitted, deadlines) -> the first admitted reader still waiting, or false;
--     an entry whose waiter left the deadlines (an older aiolock took the hold or purged
--     it) is dropped on the way
local FRW_ADMIT_MAX = 100

local function frw_admit(queue, deadlines, admitted, field)
    local self_in, others_in = false, false
    for _ = 1, FRW_ADMIT_MAX do
        local head = redis.call('lindex', queue, 0)
        if not head or string.sub(head, 1, 2) ~= 'r:' then
            break
        end
        redis.call('lpop', queue)
        if head == field then
            self_in = true
        else
            local deadline = redis.call('zscore', deadlines, head)
            if deadline then
                redis.call('zadd', admitted, deadline, head)
                others_in = true
            end
        end
    end
    if others_in then
        -- Lives as long as the deadlines it copies (their key outlives every one of them).
        redis.call('pexpire', admitted, math.max(redis.call('pttl', deadlines), 1))
    end
    return self_in, others_in
end

local function frw_admitted(admitted, deadlines)
    while true do
        local first = redis.call('zrange', admitted, 0, 0)[1]
        if not first or redis.call('zscore', deadlines, first) then
            return first or false
        end
        redis.call('zrem', admitted, first)
    end
end
