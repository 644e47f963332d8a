-- Acquire (or re-enter) the read side of a read-write lock: Redisson RReadWriteLock layout.
--
-- KEYS[1]  lock hash: "mode" -> "read" | "write", "<holder>" -> read count,
--          "<holder>:write" -> write count
-- KEYS[2]  this holder's timeout-key prefix "{name}:<holder>:rwlock_timeout"; read hold k
--          is the string key "<prefix>:k" = "1", with that hold's lease as its PEXPIRE
-- KEYS[3]  cancel tombstone of this acquire call (written by rw_read_rollback.lua)
-- ARGV[1]  lease in ms
-- ARGV[2]  holder id "<client uuid>:<n>"
-- ARGV[3]  the same holder's write field "<holder>:write"
-- ARGV[4]  the count this holder has once this call succeeds (its local count + 1)
--
-- Returns {1, count} when acquired, {0, pttl} when a writer (not this holder) has the lock
-- (pttl = ms left on the hash, -1 without expiry), {-1, 0} when this call was already
-- cancelled and rolled back, or {-2, count} when the holder's read count is not the
-- ARGV[4] - 1 it believes (see lock_acquire.lua).
--
-- Redisson semantics (spec 6.2): a free lock becomes mode=read; a read-mode lock, or a
-- write-mode lock whose writer is this very holder (downgrade path), takes one more read
-- hold and the hash TTL becomes max(its PTTL, lease). A waiting writer does not stop new
-- readers. ARGV[4] makes a resend idempotent: if the first send already took the hold,
-- the field equals the target and nothing is taken twice. Only the reply carries more
-- than Redisson's; the stored state is exactly Redisson's.

--@include times
--@include settled
--@include rw_acquire
check_ms(ARGV[1])

local function take(mode)
    if mode == false then
        redis.call('hset', KEYS[1], 'mode', 'read', ARGV[2], 1)
        redis.call('set', KEYS[2] .. ':1', 1, 'px', ARGV[1])
        redis.call('pexpire', KEYS[1], ARGV[1])
        return {1, 1}
    end
    if mode == 'read' or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
        local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
        redis.call('set', KEYS[2] .. ':' .. n, 1, 'px', ARGV[1])
        local ttl = redis.call('pttl', KEYS[1])
        redis.call('pexpire', KEYS[1], math.max(ttl, tonumber(ARGV[1])))
        return {1, n}
    end
    return {0, redis.call('pttl', KEYS[1])}
end
return rw_acquire(KEYS[3], ARGV[2], ARGV[4], take)
