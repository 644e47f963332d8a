-- Delete every hold of a fair read-write lock whoever has it, and wake its waiters. The
-- queue stays: its waiters keep their places.
--
-- KEYS[1]  state, KEYS[2] leases (see frw_acquire.lua)
-- KEYS[3]  channel "aiolock_frw__channel:{name}"
-- ARGV[1]  publish command: PUBLISH or SPUBLISH
--
-- Returns 1 if the lock was held, else 0. Fails with a WRONGTYPE error, changing nothing,
-- if KEYS[1] holds another type: that is somebody's data, not this lock's.

--@include forced

local refusal = refuse_force(KEYS[1])
if refusal ~= nil then
    return refusal
end
redis.call(ARGV[1], KEYS[3], '1')
redis.call('del', KEYS[1], KEYS[2])
return 1
