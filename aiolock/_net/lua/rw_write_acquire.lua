-- Acquire (or re-enter) the write side of a read-write lock: Redisson RReadWriteLock layout.
--
-- KEYS[1]  lock hash (see rw_read_acquire.lua)
-- KEYS[2]  cancel tombstone of this acquire call (written by rw_write_rollback.lua)
-- ARGV[1]  lease in ms
-- ARGV[2]  write field "<holder>:write"
-- ARGV[3]  the count this holder has once this call succeeds (its local count + 1)
--
-- Returns {1, count} when acquired, {0, pttl} when readers or another writer have the
-- lock, {-1, 0} when this call was already cancelled and rolled back, or {-2, count} when
-- the holder's write count is not the ARGV[3] - 1 it believes (see lock_acquire.lua).
--
-- Redisson semantics (spec 6.4): a free lock becomes mode=write with the lease; re-entry
-- by the same writer sets the TTL to its current PTTL + lease (it ADDS, unlike RLock). A
-- holder with only read holds is refused like anyone else (aiolock refuses that upgrade
-- before calling). ARGV[3] makes a resend idempotent: a resend that finds the target count
-- already there neither counts nor extends twice.

--@include times
--@include settled
--@include rw_acquire
check_ms(ARGV[1])

local function take(mode, count)
    if mode == false then
        redis.call('hset', KEYS[1], 'mode', 'write', ARGV[2], 1)
        redis.call('pexpire', KEYS[1], ARGV[1])
        return {1, 1}
    end
    if mode == 'write' and count then
        local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
        local ttl = redis.call('pttl', KEYS[1])
        redis.call('pexpire', KEYS[1], ttl + tonumber(ARGV[1]))
        return {1, n}
    end
    return {0, redis.call('pttl', KEYS[1])}
end
return rw_acquire(KEYS[2], ARGV[2], ARGV[3], take)
