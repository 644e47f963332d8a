-- Undo an acquire of a fair read-write lock whose reply never arrived (see
-- lock_rollback.lua), and take its waiter out of the queue.
--
-- KEYS[1]  state, KEYS[2] leases, KEYS[3] queue, KEYS[4] deadlines (see frw_acquire.lua)
-- KEYS[5]  channel "aiolock_frw__channel:{name}"
-- KEYS[6]  that acquire call's tombstone
-- KEYS[7]  admitted "aiolock_frw_admitted:{name}"
-- ARGV[1]  the field: "r:<holder>" or "w:<holder>"
-- ARGV[2]  the count the acquire would have produced
-- ARGV[3]  lease in ms to re-apply while holds of the field remain
-- ARGV[4]  publish command: PUBLISH or SPUBLISH
-- ARGV[5]  tombstone TTL in ms
--
-- Returns 1 if the acquire had taken a hold and it was given back, 0 if not. Either way
-- the field leaves the queue (an entry of this holder's other waiting call is re-added by
-- its next attempt) and "1" is published if that could let someone in.

--@include times
--@include clock
--@include frw_settle
--@include rollback
check_ms(ARGV[3], ARGV[5])

local function give_back(count)
    if count > 1 then
        redis.call('hincrby', KEYS[1], ARGV[1], -1)
        redis.call('zadd', KEYS[2], server_ms() + tonumber(ARGV[3]), ARGV[1])
        return
    end
    redis.call(ARGV[4], KEYS[5], '1')
    redis.call('hdel', KEYS[1], ARGV[1])
    redis.call('zrem', KEYS[2], ARGV[1])
    frw_settle(KEYS[1], KEYS[2], string.sub(ARGV[1], 1, 2) == 'w:')
end
if redis.call('zrem', KEYS[4], ARGV[1]) == 1 then
    if redis.call('zrem', KEYS[7], ARGV[1]) == 0 then
        redis.call('lrem', KEYS[3], 0, ARGV[1])
    end
    redis.call(ARGV[4], KEYS[5], '1')
end
return rolled_back(KEYS[1], ARGV[1], ARGV[2], KEYS[6], ARGV[5], give_back)
