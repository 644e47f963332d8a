-- Acquire (or re-enter) one side of a fair read-write lock, or queue up for it.
--
-- aiolock's own object (Redisson has none): holders and waiters are served in arrival
-- order; consecutive readers at the head of the queue share the lock; a writer waits only
-- for the holders and the waiters ahead of it, so a stream of readers cannot starve it.
-- Layout: see fragments/frw_settle.lua; all keys in the name's hash slot.
--
-- KEYS[1]  state "aiolock_frw:{name}"
-- KEYS[2]  leases "aiolock_frw_leases:{name}"
-- KEYS[3]  queue "aiolock_frw_queue:{name}"
-- KEYS[4]  deadlines "aiolock_frw_deadlines:{name}"
-- KEYS[5]  channel "aiolock_frw__channel:{name}"
-- KEYS[6]  cancel tombstone of this acquire call (written by frw_rollback.lua)
-- KEYS[7]  admitted "aiolock_frw_admitted:{name}" (see fragments/frw_admit.lua)
-- ARGV[1]  lease in ms
-- ARGV[2]  the field: "r:<holder>" or "w:<holder>"
-- ARGV[3]  the count this holder has once this call succeeds (its local count + 1)
-- ARGV[4]  "1": waiting variant (joins the queue), "0": no-wait variant (never does)
-- ARGV[5]  how long a queued waiter stays queued without trying again, in ms
-- ARGV[6]  publish command: PUBLISH or SPUBLISH
-- ARGV[7]  cap in ms on the wait returned
--
-- Returns {1, count} when acquired, {0, wait} when not (wait: ms the caller may sleep at
-- most before it tries again, refreshing its queue entry), {-1, 0} when this call was
-- cancelled and rolled back already, {-2, count} when the holder's count is not ARGV[3] - 1
-- (see lock_acquire.lua). ARGV[3] makes a resend idempotent, as in lock_acquire.lua.
--
-- Re-entry is never queued: a holder takes its own side again at once, and a writer may
-- take the read side too. A new read hold needs no write hold of another holder and no
-- writer queued ahead of it: the reader was admitted with the readers at the head of the
-- queue (fragments/frw_admit.lua), or the queue is empty. A new write hold needs no hold
-- at all, no admitted reader still to come in, and to be at the head of the queue (or the
-- queue empty). A reader that admits others publishes, so that they come in together.
-- Anything purged (a lease ran out, a waiter gone) publishes too: someone may get in now.
-- Every attempt is O(1) in the queue length (O(log) for the sorted sets), except that a
-- reader pops at most 100 readers at the head and a dead waiter is LREMed once.

--@include times
--@include clock
--@include frw_settle
--@include frw_purge
--@include frw_hint
--@include frw_admit
--@include settled
check_ms(ARGV[1], ARGV[5])

local now = server_ms()

local function hold(count)
    redis.call('zadd', KEYS[2], now + tonumber(ARGV[1]), ARGV[2])
    for _, key in ipairs({KEYS[1], KEYS[2]}) do
        if redis.call('pttl', key) < tonumber(ARGV[1]) then
            redis.call('pexpire', key, ARGV[1])
        end
    end
    return {1, count}
end

-- The common case first: a first hold (ARGV[3] is 1) on a lock nobody holds or queues for,
-- for a call not rolled back. With the state, the leases, the queue, the deadlines and the
-- tombstone and the admitted set all absent, the general path below purges nothing, publishes nothing and grants
-- the hold, in about seventeen calls; one EXISTS, the HSET and hold() do the same.
if ARGV[3] == '1' and redis.call('exists', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7]) == 0 then
    local mode = string.sub(ARGV[2], 1, 2) == 'r:' and 'read' or 'write'
    redis.call('hset', KEYS[1], 'mode', mode, ARGV[2], 1)
    return hold(1)
end

if frw_purge(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[7], now) then
    redis.call(ARGV[6], KEYS[5], '1')
end

local reply, count = settled(KEYS[1], ARGV[2], ARGV[3], nil)
if reply then
    if reply[1] == 1 then
        return hold(reply[2])
    end
    return reply
end
if redis.call('exists', KEYS[6]) == 1 then
    return {-1, 0}
end
if count then
    return hold(redis.call('hincrby', KEYS[1], ARGV[2], 1))
end

local reading = string.sub(ARGV[2], 1, 2) == 'r:'
local holder = string.sub(ARGV[2], 3)
local mode = redis.call('hget', KEYS[1], 'mode')
local granted, popped = false, false
if reading then
    if redis.call('hexists', KEYS[1], 'w:' .. holder) == 1 then
        granted = true
    elseif mode ~= 'write' then
        if redis.call('zscore', KEYS[7], ARGV[2]) then
            granted = true
        else
            local others
            popped, others = frw_admit(KEYS[3], KEYS[4], KEYS[7], ARGV[2])
            if others then
                redis.call(ARGV[6], KEYS[5], '1')
            end
            -- Not queued (or its entry lost to an older aiolock's admission): only with
            -- no waiter left ahead.
            granted = popped or redis.call('llen', KEYS[3]) == 0
        end
    end
elseif not mode then
    local head = redis.call('lindex', KEYS[3], 0)
    granted = (not head or head == ARGV[2]) and not frw_admitted(KEYS[7], KEYS[4])
end

if granted then
    if redis.call('zrem', KEYS[4], ARGV[2]) == 1 and not popped then
        if redis.call('zrem', KEYS[7], ARGV[2]) == 0 then
            -- A writer at the head, or a reader that also holds the write lock.
            if redis.call('lindex', KEYS[3], 0) == ARGV[2] then
                redis.call('lpop', KEYS[3])
            else
                redis.call('lrem', KEYS[3], 1, ARGV[2])
            end
        end
    end
    if mode ~= 'write' then
        redis.call('hset', KEYS[1], 'mode', reading and 'read' or 'write')
    end
    return hold(redis.call('hincrby', KEYS[1], ARGV[2], 1))
end

if ARGV[4] == '1' then
    local deadline = now + tonumber(ARGV[5])
    if redis.call('zadd', KEYS[4], deadline, ARGV[2]) == 1 then
        redis.call('rpush', KEYS[3], ARGV[2])
    end
    -- An admitted reader kept out by a writer of an older aiolock keeps its entry fresh.
    redis.call('zadd', KEYS[7], 'xx', deadline, ARGV[2])
    for _, key in ipairs({KEYS[3], KEYS[4], KEYS[7]}) do
        redis.call('pexpire', key, ARGV[5])
    end
end
return {0, frw_hint(KEYS[2], KEYS[3], KEYS[4], KEYS[7], now, tonumber(ARGV[7]))}
