-- The permits available in a permit-expirable semaphore, once those whose lease ran out are
-- back: Redisson availablePermits.
--
-- KEYS[1]  the semaphore
-- KEYS[2]  "{name}:timeout"
-- KEYS[3]  the semaphore's channel "redisson_sc:{name}"
-- ARGV[1]  publish command: PUBLISH or SPUBLISH
--
-- Returns the number available (0 if never set). Reclaiming is idempotent: a resend is
-- harmless.

--@include permits
--@include clock
--@include reclaim

reclaim(KEYS[1], KEYS[2], KEYS[3], ARGV[1], server_ms(), -1)
return tonumber(redis.call('get', KEYS[1])) or 0
