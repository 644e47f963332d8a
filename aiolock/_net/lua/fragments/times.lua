-- Fragment times: the check a script runs on its times in ms before anything else. Redis
-- never rolls a script back: a PEXPIRE or SET PX that fails after an HINCRBY leaves a hold
-- with no expiry. A script that checks first fails before it writes, whoever calls it.
--
-- Expects: nothing (values are arguments).
-- Defines:
--   check_ms(...)  each of its one to three arguments is a time in ms that a key may be
--     given: an integer as Redis reads one (digits, no sign, no leading zero), 1 ..
--     MAX_MS (aiolock/_config.py MAX_MS, which says why); else the script fails with an
--     error naming the value, having written nothing.
--   ms_or_fail(value)  the same check of one value (check_ms's part).
local MAX_MS = 1000000000000

local function ms_or_fail(value)
    -- A leading zero too: Redis refuses '0100' as a time, where Lua reads 100. Up to 12
    -- digits is below MAX_MS (13 digits) with no number made.
    if type(value) ~= 'string' or not string.find(value, '^[1-9]%d*$')
            or #value > 12 and tonumber(value) > MAX_MS then
        error({err = 'ERR aiolock: a time of ' .. tostring(value)
            .. ' ms is not an integer in 1 .. ' .. MAX_MS})
    end
end

-- Not a loop over select(i, ...): this runs in every script, and each select() call
-- walks the arguments again (twice the time for three).
local function check_ms(...)
    local count = select('#', ...)
    local first, second, third = ...
    ms_or_fail(first)
    if count > 1 then
        ms_or_fail(second)
    end
    if count > 2 then
        ms_or_fail(third)
    end
    if count > 3 then
        error({err = 'ERR aiolock: check_ms takes at most three times'})
    end
end
