-- Acquire (or re-enter) a fair lock, or queue up for it: Redisson RFairLock layout.
--
-- KEYS[1]  lock hash: holder id -> reentrancy count
-- KEYS[2]  queue "redisson_lock_queue:{name}": waiting holder ids, head first
-- KEYS[3]  timeouts "redisson_lock_timeout:{name}": holder id -> eviction deadline (epoch ms)
-- KEYS[4]  cancel tombstone of this acquire call (written by fair_rollback.lua)
-- ARGV[1]  lease in ms
-- ARGV[2]  holder id "<client uuid>:<n>"
-- ARGV[3]  W, this call's waiter timeout in ms (its try_lock wait, else the client default)
-- ARGV[4]  now: the caller's wall clock in epoch ms
-- ARGV[5]  the count this holder has once this call succeeds (its local count + 1)
-- ARGV[6]  "1": waiting variant (joins the queue), "0": no-wait variant (never does)
-- ARGV[7]  cap in ms on the wait returned while the lock is free but another waiter's turn
--
-- Returns {1, count} when acquired (count = the holder's count after this call), or
-- {0, wait} when it is not this holder's turn, {-1, 0} when this call was already
-- cancelled and rolled back, or {-2, count} when the holder's count is not the ARGV[5] - 1
-- it believes (see lock_acquire.lua).
--
-- Redisson semantics, step by step: purge the expired waiters at the head; a free lock
-- goes to this holder if the queue is empty or it is at the head (it leaves the queue and
-- every deadline left in it moves up by W); the holder re-enters; a queued holder keeps
-- its place and its deadline; otherwise it joins the tail with deadline = (the tail's
-- deadline, or the lock's PTTL from now) + W. The no-wait variant stops before queueing.
--
-- What is stored is exactly Redisson's; only the returned values carry more:
-- * ARGV[5] makes a resent call idempotent, as in lock_acquire.lua; a resent enqueue is
--   idempotent anyway (the holder is found queued).
-- * "wait" bounds the caller's sleep until it retries if no message wakes it: the lock's
--   PTTL while it is held (-1: no expiry), else (free, but the head is another waiter that
--   is about to take it, or is dead and purged at its deadline) the head's deadline from
--   now, capped by ARGV[7]. Redisson returns 0 there, and its waiters spin.

--@include times
--@include fair_purge
check_ms(ARGV[1], ARGV[3])

-- The common case first: a first hold (ARGV[5] is 1) on a free lock nobody queues for, for
-- a call not rolled back. With the hash, the queue, the timeouts and the tombstone all
-- absent, the general path below would purge nothing, pop nothing, move no deadline and
-- take the hold, in ten calls; one EXISTS and the two that take it do the same.
local function take_free()
    redis.call('hset', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, 1}
end
if ARGV[5] == '1' and redis.call('exists', KEYS[1], KEYS[2], KEYS[3], KEYS[4]) == 0 then
    return take_free()
end
if redis.call('exists', KEYS[4]) == 1 then
    return {-1, 0}
end
local now = tonumber(ARGV[4])
local expired = expired_waiters(now)
pop_waiters(expired)

local count = redis.call('hget', KEYS[1], ARGV[2])
if count and tonumber(count) ~= tonumber(ARGV[5]) and tonumber(count) ~= tonumber(ARGV[5]) - 1 then
    return {-2, tonumber(count)}
end
if count then
    if tonumber(count) ~= tonumber(ARGV[5]) then
        count = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    end
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, tonumber(count)}
end
if tonumber(ARGV[5]) ~= 1 then
    return {-2, 0}
end
if redis.call('exists', KEYS[1]) == 0 then
    local head = redis.call('lindex', KEYS[2], 0)
    if not head or head == ARGV[2] then
        redis.call('lpop', KEYS[2])
        redis.call('zrem', KEYS[3], ARGV[2])
        local waiting = redis.call('zrange', KEYS[3], 0, -1)
        for i = 1, #waiting do
            redis.call('zincrby', KEYS[3], -tonumber(ARGV[3]), waiting[i])
        end
        return take_free()
    end
end

if ARGV[6] == '1' and not redis.call('zscore', KEYS[3], ARGV[2]) then
    local tail = redis.call('lindex', KEYS[2], -1)
    local tail_deadline = false
    if tail and tail ~= ARGV[2] then
        tail_deadline = redis.call('zscore', KEYS[3], tail)
    end
    local ttl
    if tail_deadline then
        ttl = tonumber(tail_deadline) - now
    else
        ttl = redis.call('pttl', KEYS[1])
    end
    if redis.call('zadd', KEYS[3], ttl + tonumber(ARGV[3]) + now, ARGV[2]) == 1 then
        redis.call('rpush', KEYS[2], ARGV[2])
    end
end

local pttl = redis.call('pttl', KEYS[1])
if pttl ~= -2 then
    return {0, pttl}
end
local head = redis.call('lindex', KEYS[2], 0)
local head_deadline = head and tonumber(redis.call('zscore', KEYS[3], head))
if head_deadline then
    return {0, math.max(math.min(head_deadline - now, tonumber(ARGV[7])), 0)}
end
return {0, -1}
