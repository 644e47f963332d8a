-- Fragment counts: the check a script runs on a count before anything else, so that a
-- count Redis cannot store is refused before any write, whoever calls the script.
--
-- Expects: nothing (values are arguments).
-- Defines:
--   check_count(value, negative)  value is an integer Redis can store: digits with no
--     leading zero (a leading '-' too if negative), within int64; else the script fails
--     with an error naming the value, having written nothing.
local function check_count(value, negative)
    -- No leading zero (nor '-0'): Redis refuses '007' as a count, where Lua reads 7.
    local digits = type(value) == 'string' and (value == '0' and value
        or string.match(value, negative and '^-?([1-9]%d*)$' or '^([1-9]%d*)$'))
    -- Up to 18 digits always fits an int64; 19 fit up to its bound (the same length, so
    -- the strings compare as the numbers do).
    local ok = digits and #digits <= 19
    if ok and #digits == 19 then
        ok = digits <= (string.sub(value, 1, 1) == '-' and '9223372036854775808'
            or '9223372036854775807')
    end
    if not ok then
        error({err = 'ERR aiolock: a count of ' .. tostring(value)
            .. ' is not an integer Redis can store'})
    end
end
