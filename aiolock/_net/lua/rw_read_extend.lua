-- extend() of one holder's read holds: each gets the lease from now, and the hash the
-- longest lease left among every reader's holds (shorter than before if this holder's
-- was the longest), as a read unlock recomputes it (rw_read_release.lua).
--
-- KEYS[1]  lock hash
-- KEYS[2]  this holder's timeout-key prefix "{name}:<holder>:rwlock_timeout"
-- KEYS[3]  the name's key prefix "{name}" (the bare name if it has a "{"): every holder's
--          timeout keys are "<KEYS[3]>:<field>:rwlock_timeout:<k>"
-- ARGV[1]  lease in ms
-- ARGV[2]  holder id (its read field)
-- ARGV[3]  the read holds of the holder, as a comma list of their numbers k ("1,2")
--
-- Returns {1} if every listed hold was alive (each then has the lease), {0} if the field
-- is gone or one of those holds' timeout keys has run out: the caller reports it lost.
-- While the hash is in write mode (the holder's own write hold, which the hash's TTL is the
-- lease of) the hash's TTL is only ever raised, never lowered. A key of another type
-- counts as gone (pcall), as in the renewal.

--@include times
check_ms(ARGV[1])

local count = redis.pcall('hget', KEYS[1], ARGV[2])
local holds = type(count) == 'string' and tonumber(count) or nil
if holds == nil or holds <= 0 then
    return {0}
end
for k in string.gmatch(ARGV[3], '%d+') do
    if tonumber(k) > holds or redis.call('pexpire', KEYS[2] .. ':' .. k, ARGV[1]) == 0 then
        return {0}
    end
end

local lease = tonumber(ARGV[1])
if redis.call('hget', KEYS[1], 'mode') == 'write' then
    if redis.call('pttl', KEYS[1]) < lease then
        redis.call('pexpire', KEYS[1], lease)
    end
    return {1}
end
-- The longest lease left among every reader's timeout keys, this holder's new one included.
local longest = lease
local fields = redis.call('hgetall', KEYS[1])
for i = 1, #fields, 2 do
    local n = tonumber(fields[i + 1])
    if n and fields[i] ~= ARGV[2] then
        for k = n, 1, -1 do
            local ttl = redis.call('pttl', KEYS[3] .. ':' .. fields[i] .. ':rwlock_timeout:' .. k)
            if ttl > longest then
                longest = ttl
            end
        end
    end
end
redis.call('pexpire', KEYS[1], longest)
return {1}
