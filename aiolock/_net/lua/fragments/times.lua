-- Fragment times: the check a script runs on its times in ms before anything else. Redis
-- never rolls a script back: a PEXPIRE or SET PX that fails after an HINCRBY leaves a hold
-- with no expiry. A script that checks first fails before it writes, whoever calls it.
--
-- Expects: nothing (values are arguments).
-- Defines:
--   check_ms(...)  each argument is a time in ms that a key may be given: digits only,
--     1 .. MAX_MS (aiolock/_config.py MAX_MS, which says why); else the script fails
--     with an error naming the value, having written nothing.
local MAX_MS = 1000000000000

local function check_ms(...)
    for i = 1, select('#', ...) do
        local value = select(i, ...)
        local ms = type(value) == 'string' and string.match(value, '^%d+$') and tonumber(value)
        if not ms or ms < 1 or ms > MAX_MS then
            error({err = 'ERR aiolock: a time of ' .. tostring(value)
                .. ' ms is not an integer in 1 .. ' .. MAX_MS})
        end
    end
end
