-- Watchdog renewal of a batch of fair read-write lock holds.
--
-- KEYS[2i-1]  state of hold i, KEYS[2i] its leases ZSET (at most 100 holds per call; all
--             in one cluster slot)
-- ARGV[1]     lease in ms
-- ARGV[i+1]   the field of hold i: "r:<holder>" or "w:<holder>"
--
-- Returns one entry per hold: 1 if it is still there and its lease was renewed, 0 if it
-- is gone (its lease ran out and was purged, or it was taken), so the caller marks it lost.

--@include times
--@include clock
--@include renew
check_ms(ARGV[1])

local now = server_ms()
local function renew(i)
    local state, leases, field = KEYS[2 * i - 1], KEYS[2 * i], ARGV[i + 1]
    local ends = redis.pcall('zscore', leases, field)
    if type(ends) ~= 'string' or tonumber(ends) <= now then
        return false
    end
    if redis.pcall('hexists', state, field) ~= 1 then
        return false
    end
    redis.call('zadd', leases, now + tonumber(ARGV[1]), field)
    for _, key in ipairs({state, leases}) do
        if redis.call('pttl', key) < tonumber(ARGV[1]) then
            redis.call('pexpire', key, ARGV[1])
        end
    end
    return true
end
return renew_each(#KEYS / 2, renew)
