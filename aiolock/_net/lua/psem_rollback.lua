-- Undo an attempt to take permits of a permit-expirable semaphore whose reply never
-- arrived, so that no permit stays taken by nobody's knowledge.
--
-- KEYS[1]  the semaphore
-- KEYS[2]  "{name}:timeout"
-- KEYS[3]  the semaphore's channel "redisson_sc:{name}"
-- KEYS[4]  that attempt's tombstone (the KEYS[4] it was sent with)
-- ARGV[1]  publish command: PUBLISH or SPUBLISH
-- ARGV[2]  tombstone TTL in ms
-- ARGV[3…] that attempt's ids
--
-- Returns how many of its permits were given back (the new count published). The
-- tombstone is written either way, so that a copy of the attempt still on its way takes
-- nothing.

--@include times
--@include permits
check_ms(ARGV[2])

-- The permits first: if they cannot be given (a count at int64's bound), nothing changed.
local removed = 0
for i = 3, #ARGV do
    if redis.call('zscore', KEYS[2], ARGV[i]) then
        removed = removed + 1
    end
end
if removed > 0 then
    give_permits(KEYS[1], KEYS[3], removed, ARGV[1])
    redis.call('zrem', KEYS[2], unpack(ARGV, 3))
end
redis.call('set', KEYS[4], 1, 'px', ARGV[2])
return removed
