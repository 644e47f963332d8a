-- Take a waiter of a fair read-write lock out of its queue (its wait ran out, or it was
-- cancelled): the waiters behind it must not wait for it.
--
-- KEYS[1]  queue "aiolock_frw_queue:{name}"
-- KEYS[2]  deadlines "aiolock_frw_deadlines:{name}"
-- KEYS[3]  channel "aiolock_frw__channel:{name}"
-- KEYS[4]  admitted "aiolock_frw_admitted:{name}": an admitted reader is no longer in the
--          list (see fragments/frw_admit.lua)
-- ARGV[1]  the waiter: "r:<holder>" or "w:<holder>"
-- ARGV[2]  publish command: PUBLISH or SPUBLISH
--
-- Returns 1 if it was queued (then "1" is published: those behind it may get in now), else
-- 0. Leaving twice removes nothing more.
if redis.call('zrem', KEYS[2], ARGV[1]) == 0 then
    return 0
end
if redis.call('zrem', KEYS[4], ARGV[1]) == 0 then
    redis.call('lrem', KEYS[1], 0, ARGV[1])
end
redis.call(ARGV[2], KEYS[3], '1')
return 1
