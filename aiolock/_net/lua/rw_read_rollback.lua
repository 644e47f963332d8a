-- Undo a read acquire whose reply never arrived (the caller was cancelled while it was in
-- flight), so no read hold is left that nobody knows about.
--
-- KEYS[1]  lock hash
-- KEYS[2]  channel "redisson_rwlock:{name}"
-- KEYS[3]  this holder's timeout-key prefix "{name}:<holder>:rwlock_timeout"
-- KEYS[4]  the name's key prefix "{name}" (see rw_read_release.lua)
-- KEYS[5]  cancel tombstone of that acquire call (the same KEYS[3] it was sent with)
-- ARGV[1]  holder id
-- ARGV[2]  the count the acquire would have produced
-- ARGV[3]  publish command
-- ARGV[4]  tombstone TTL in ms
--
-- Returns 1 if the acquire had taken a hold and it was given back (exactly as a read
-- unlock would: TTL recomputed from the remaining timeout keys, or the hash deleted and
-- "0" published), 0 if it had not. The tombstone is written either way, so a copy of the
-- acquire that reaches the server later takes nothing.
--
-- Everything is decided before anything is written, and the message is published first,
-- as in rw_read_release.lua: a refused PUBLISH then fails the script with nothing changed.

--@include times
--@include rw_read_unlock
--@include rollback
check_ms(ARGV[4])

local function give_back(held)
    local mode = redis.call('hget', KEYS[1], 'mode')
    drop_read_hold(ARGV[1], held, mode, ARGV[3], '0')
end
return rolled_back(KEYS[1], ARGV[1], ARGV[2], KEYS[5], ARGV[4], give_back)
