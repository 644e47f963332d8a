-- Fragment frw_hint: how long a waiter of a fair read-write lock may sleep.
--
-- Expects: nothing (keys and values are arguments).
-- Defines:
--   frw_hint(leases, queue, deadlines, admitted, now, cap) -> ms a waiter may sleep at
--     most: until the earliest lease ends (nobody publishes when a lease runs out), or
--     else the earliest deadline of an admitted reader or of the head waiter (a dead one
--     is purged then), capped
local function frw_hint(leases, queue, deadlines, admitted, now, cap)
    local until_ms = false
    local first = redis.call('zrange', leases, 0, 0, 'withscores')
    if first[2] then
        until_ms = tonumber(first[2]) - now
    else
        local head = redis.call('lindex', queue, 0)
        local deadline = head and redis.call('zscore', deadlines, head)
        if deadline then
            until_ms = tonumber(deadline) - now
        end
        local let_in = redis.call('zrange', admitted, 0, 0, 'withscores')
        if let_in[2] and (not until_ms or tonumber(let_in[2]) - now < until_ms) then
            until_ms = tonumber(let_in[2]) - now
        end
    end
    if not until_ms or until_ms > cap then
        return cap
    end
    return math.max(until_ms, 0)
end
