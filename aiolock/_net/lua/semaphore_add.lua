-- Release permits, or add some: Redisson RSemaphore release / addPermits.
--
-- KEYS[1]  the semaphore
-- KEYS[2]  the semaphore's channel "redisson_sc:{name}"
-- KEYS[3]  this call's latch "redisson_unlock_latch:{name}:<request id>"
-- ARGV[1]  permits to add (a release's are >= 1; add_permits may take some away)
-- ARGV[2]  publish command: PUBLISH or SPUBLISH
-- ARGV[3]  latch TTL in ms
--
-- Returns 1. The new count is published whenever it is above 0, as Redisson's receivers
-- read it: "wake up to this many". A resend of the same call replays the latch and adds
-- nothing twice (Redisson's release, resent, adds its permits again).
--
-- Redisson's addPermits rewrites the key with SET, which drops a TTL set by
-- trySetPermits(n, ttl); INCRBY keeps it.

--@include times
--@include counts
--@include latch
--@include permits
check_ms(ARGV[3])
check_count(ARGV[1], true)

local function add()
    give_permits(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
    return 1
end
return latched(KEYS[3], ARGV[3], add)
