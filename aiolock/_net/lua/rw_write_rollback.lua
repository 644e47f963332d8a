-- Undo a write acquire whose reply never arrived (the caller was cancelled while it was in
-- flight), so no write hold is left that nobody knows about.
--
-- KEYS[1]  lock hash
-- KEYS[2]  channel "redisson_rwlock:{name}"
-- KEYS[3]  cancel tombstone of that acquire call (the same KEYS[2] it was sent with)
-- ARGV[1]  write field "<holder>:write"
-- ARGV[2]  the count the acquire would have produced
-- ARGV[3]  lease in ms to re-apply while write holds remain
-- ARGV[4]  publish command
-- ARGV[5]  tombstone TTL in ms
--
-- Returns 1 if the acquire had taken a hold and it was given back (exactly as a write
-- unlock would: deleted with "1" published, or downgraded to mode=read if the holder also
-- has read holds), 0 if it had not. The tombstone is written either way, so a copy of the
-- acquire that reaches the server later takes nothing. The message is published before
-- anything is written, so that a refused PUBLISH changes nothing.

--@include times
--@include hold
--@include rollback
--@include rw_write_unlock
check_ms(ARGV[3], ARGV[5])

local function free()
    free_write(ARGV[1], ARGV[4], '1')
end
local function give_back()
    release_hold(KEYS[1], ARGV[1], ARGV[3], free)
end
return rolled_back(KEYS[1], ARGV[1], ARGV[2], KEYS[3], ARGV[5], give_back)
