-- Undo a drain whose reply never arrived (its caller was cancelled, or the connection was
-- cut), so that no permit disappears by nobody's knowledge.
--
-- KEYS[1]  the semaphore
-- KEYS[2]  the semaphore's channel "redisson_sc:{name}"
-- KEYS[3]  that attempt's receipt (the KEYS[2] semaphore_drain.lua was sent with)
-- ARGV[1]  publish command: PUBLISH or SPUBLISH
-- ARGV[2]  receipt TTL in ms
--
-- Returns 1 if the attempt had drained and its count was given back (the new count
-- published when above 0, as a release does), 0 if it had not. The receipt becomes "void"
-- either way, so that a copy of the attempt still on its way takes nothing, and a resend
-- of this undo gives nothing back twice.

--@include times
--@include permits
check_ms(ARGV[2])

local receipt = redis.call('get', KEYS[3])
local drained = receipt and string.sub(receipt, 1, 8) == 'drained:'
if drained then
    local count = string.sub(receipt, 9)
    -- The count is the key's former value, a decimal string: INCRBY takes it exactly.
    if count ~= '0' then
        give_permits(KEYS[1], KEYS[2], count, ARGV[1])
    end
end
redis.call('set', KEYS[3], 'void', 'px', ARGV[2])
if drained then
    return 1
end
return 0
