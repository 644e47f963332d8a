-- Undo a read acquire whose reply never arrived (the caller was cancelled while it was in
-- flight), so no read hold is left that nobody knows about.
--
-- KEYS[1]  lock hash
-- KEYS[2]  channel "redisson_rwlock:{name}"
-- KEYS[3]  this holder's timeout-key prefix "{name}:<holder>:rwlock_timeout"
-- KEYS[4]  the name's key prefix "{name}" (see rw_read_release.lua)
-- KEYS[5]  cancel tombstone of that acquire call (the same KEYS[3] it was sent with)
-- ARGV[1]  holder id
-- ARGV[2]  the count the acquire would have produced
-- ARGV[3]  publish command
-- ARGV[4]  tombstone TTL in ms
--
-- Returns 1 if the acquire had taken a hold and it was given back (exactly as a read
-- unlock would: TTL recomputed from the remaining timeout keys, or the hash deleted and
-- "0" published), 0 if it had not. The tombstone is written either way, so a copy of the
-- acquire that reaches the server later takes nothing.
--
-- Everything is decided before anything is written, and the message is published first,
-- as in rw_read_release.lua: a refused PUBLISH then fails the script with nothing changed.
local held = redis.call('hget', KEYS[1], ARGV[1])
if not held or tonumber(held) ~= tonumber(ARGV[2]) then
    redis.call('set', KEYS[5], 1, 'px', ARGV[4])
    return 0
end
local mode = redis.call('hget', KEYS[1], 'mode')
local count = tonumber(held) - 1

-- The hash once this hold is dropped: how many fields it keeps, and the longest lease
-- left among their timeout keys (this hold's own key is about to go, so it is skipped).
local fields = redis.call('hgetall', KEYS[1])
local kept = #fields / 2
if count == 0 then
    kept = kept - 1
end
local longest = -3
if kept > 1 then
    for i = 1, #fields, 2 do
        local holds = tonumber(fields[i + 1])
        if fields[i] == ARGV[1] then
            holds = count
        end
        if holds then
            for k = holds, 1, -1 do
                local ttl = redis.call('pttl', KEYS[4] .. ':' .. fields[i] .. ':rwlock_timeout:' .. k)
                longest = math.max(longest, ttl)
            end
        end
    end
end
-- Freed unless live read holds remain, or a writer (this holder, downgrading) holds it.
local frees = kept <= 1 or (longest <= 0 and mode ~= 'write')
if frees then
    redis.call(ARGV[3], KEYS[2], '0')
end

if count == 0 then
    redis.call('hdel', KEYS[1], ARGV[1])
else
    redis.call('hincrby', KEYS[1], ARGV[1], -1)
end
redis.call('del', KEYS[3] .. ':' .. (count + 1))
if frees then
    redis.call('del', KEYS[1])
elseif longest > 0 then
    redis.call('pexpire', KEYS[1], longest)
end
redis.call('set', KEYS[5], 1, 'px', ARGV[4])
return 1
