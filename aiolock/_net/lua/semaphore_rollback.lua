-- Undo an attempt to take permits whose reply never arrived (its caller was cancelled, or
-- the connection was cut), so that no permit stays taken by nobody's knowledge.
--
-- KEYS[1]  the semaphore
-- KEYS[2]  the semaphore's channel "redisson_sc:{name}"
-- KEYS[3]  that attempt's receipt (the KEYS[2] it was sent with)
-- ARGV[1]  permits the attempt asked for
-- ARGV[2]  publish command: PUBLISH or SPUBLISH
-- ARGV[3]  receipt TTL in ms
--
-- Returns 1 if the attempt had taken the permits and they were given back (the new count
-- published, as a release does), 0 if it had not. The receipt becomes "void" either way,
-- so that a copy of the attempt still on its way takes nothing, and a resend of this
-- rollback gives nothing back twice.
--@include times
--@include counts
--@include permits
check_ms(ARGV[3])
check_count(ARGV[1], false)

local taken = redis.call('get', KEYS[3]) == 'taken'
if taken then
    give_permits(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
end
redis.call('set', KEYS[3], 'void', 'px', ARGV[3])
if taken then
    return 1
end
return 0
