-- Acquire (or re-enter) a reentrant lock: Redisson RLock layout.
--
-- KEYS[1]  lock hash: holder id -> reentrancy count
-- KEYS[2]  cancel tombstone of this acquire call (written by lock_rollback.lua)
-- ARGV[1]  lease in ms
-- ARGV[2]  holder id "<client uuid>:<n>"
-- ARGV[3]  the count this holder has once this call succeeds (its local count + 1)
--
-- Returns {1, count} when acquired (count = the holder's count after this call), or
-- {0, pttl} when another holder has it (pttl = ms left on its lease, -1 without expiry),
-- or {-1, 0} when this call was already cancelled and rolled back, or {-2, count} when
-- the holder's count is not the ARGV[3] - 1 it believes it has (a hold it lost without
-- knowing): nothing is taken, and the caller corrects its belief and tries again.
--
-- ARGV[3] makes a resent call idempotent: if the first send already took the hold, the
-- field already equals the target count, so the resend refreshes the lease and does not
-- count twice. A hold is only ever taken from ARGV[3] - 1, so a rollback that finds the
-- target count knows this call took it. The stored state is exactly Redisson's; only the
-- return value carries more.

--@include settled

local reply, count = settled(KEYS[1], ARGV[2], ARGV[3], ARGV[1])
if reply then
    return reply
end
if not count and redis.call('exists', KEYS[1]) == 1 then
    return {0, redis.call('pttl', KEYS[1])}
end
-- About to take a hold: unless this call was cancelled and rolled back already.
if redis.call('exists', KEYS[2]) == 1 then
    return {-1, 0}
end
count = redis.call('hincrby', KEYS[1], ARGV[2], 1)
redis.call('pexpire', KEYS[1], ARGV[1])
return {1, count}
