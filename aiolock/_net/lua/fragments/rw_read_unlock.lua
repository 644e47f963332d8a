-- Fragment rw_read_unlock: one read hold of a read-write lock given back, as Redisson's read
-- unlock does it (spec 6.3; see rw_read_release.lua for why the keys are named so).
--
-- Expects: KEYS[1] the lock hash, KEYS[2] the channel "redisson_rwlock:{name}", KEYS[3] the
-- holder's timeout-key prefix, KEYS[4] the name's key prefix, as in rw_read_release.lua.
-- Defines:
--   drop_read_hold(holder, held, mode, publish, message)
--     holder has held read holds (at least 1) and the hash's mode is mode: its last-taken
--     hold goes. The hash then keeps the longest lease left among the timeout keys of its
--     fields, or is deleted with message published by the publish command if no live
--     read hold remains (unless a writer holds it).
local function drop_read_hold(holder, held, mode, publish, message)
    local count = held - 1

    -- Everything is decided before anything is written, so a refused PUBLISH (ACL) fails
    -- the script with the hold still there. The hash once this hold is dropped: how many
    -- fields it keeps, and the longest lease left among their timeout keys (this hold's
    -- own key is about to go, so it is skipped).
    local fields = redis.call('hgetall', KEYS[1])
    local kept = #fields / 2
    if count == 0 then
        kept = kept - 1
    end
    local longest = -3
    if kept > 1 then
        for i = 1, #fields, 2 do
            local holds = tonumber(fields[i + 1])
            if fields[i] == holder then
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
        redis.call(publish, KEYS[2], message)
    end

    if count == 0 then
        redis.call('hdel', KEYS[1], holder)
    else
        redis.call('hincrby', KEYS[1], holder, -1)
    end
    redis.call('del', KEYS[3] .. ':' .. (count + 1))
    if frees then
        redis.call('del', KEYS[1])
    elseif longest > 0 then
        redis.call('pexpire', KEYS[1], longest)
    end
end
