-- Release one read hold of a read-write lock: Redisson read unlock, with the unlock latch.
--
-- KEYS[1]  lock hash
-- KEYS[2]  channel "redisson_rwlock:{name}"
-- KEYS[3]  this holder's timeout-key prefix "{name}:<holder>:rwlock_timeout"
-- KEYS[4]  the name's key prefix "{name}" (the bare name if it has a "{"): every holder's
--          timeout keys are "<KEYS[4]>:<field>:rwlock_timeout:<k>"
-- KEYS[5]  unlock latch "redisson_unlock_latch:{name}:<request id>"
-- ARGV[1]  read unlock message "0"
-- ARGV[2]  holder id
-- ARGV[3]  publish command: PUBLISH or SPUBLISH
-- ARGV[4]  latch TTL in ms
--
-- Returns nil if the holder has no read hold, 0 if it still has read holds, 1 if this was
-- its last one (the lock itself may still be held by other readers or by this holder's
-- write hold). A resend of the same call replays the first result from the latch.
--
-- Redisson semantics (spec 6.3): drop the holder's highest-numbered timeout key; while
-- other fields remain, the hash TTL becomes the longest PTTL among the timeout keys of
-- every field in the hash (other clients' and Java holders' included, which is why they
-- must be named exactly so); with no live read hold left the hash is deleted and "0"
-- published, unless a writer (this holder, downgrading) still holds it. An unlock of a
-- lock with no mode publishes "0" too (a wake-up) and reports "not held". The timeout
-- keys of other holders are named from the hash's fields, so they cannot be in KEYS;
-- the "{name}" hash tag keeps them in the lock's cluster slot.
--
-- Unlike Redisson, nothing is written to the latch on a nil reply: the latch is private to
-- this call, and a resend recomputes nil anyway.
--
-- Everything is decided before anything is written, and the message is published first:
-- a refused PUBLISH (ACL) then fails the script with the hold still there, as the
-- caller's bookkeeping assumes after an error. Subscribers receive it after the script
-- either way, and the state stored is the same as in Redisson's order.
local done = redis.call('get', KEYS[5])
if done then
    return tonumber(done)
end
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    redis.call(ARGV[3], KEYS[2], ARGV[1])
    return nil
end
local held = tonumber(redis.call('hget', KEYS[1], ARGV[2]))
if not held then
    return nil
end
local count = held - 1
local result = 0
if count == 0 then
    result = 1
end

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
        if fields[i] == ARGV[2] then
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
    redis.call(ARGV[3], KEYS[2], ARGV[1])
end

if count == 0 then
    redis.call('hdel', KEYS[1], ARGV[2])
else
    redis.call('hincrby', KEYS[1], ARGV[2], -1)
end
redis.call('del', KEYS[3] .. ':' .. (count + 1))
if frees then
    redis.call('del', KEYS[1])
elseif longest > 0 then
    redis.call('pexpire', KEYS[1], longest)
end
redis.call('set', KEYS[5], result, 'px', ARGV[4])
return result
