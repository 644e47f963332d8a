-- Undo an acquire whose reply never arrived (the caller was cancelled while it was in
-- flight), so no hold is left that nobody knows about.
--
-- KEYS[1]  lock hash
-- KEYS[2]  lock channel
-- KEYS[3]  cancel tombstone of that acquire call (the same KEYS[2] it was sent with)
-- ARGV[1]  holder id
-- ARGV[2]  the count the acquire would have produced
-- ARGV[3]  lease in ms to re-apply while holds remain
-- ARGV[4]  publish command, or '' for none (the spin lock)
-- ARGV[5]  tombstone TTL in ms
--
-- Returns 1 if the acquire had taken a hold and it was given back, 0 if it had not. The
-- tombstone is written either way: a copy of the acquire still on its way (a resend, or a
-- send buffered on a dead connection) that reaches the server later takes nothing. The
-- message is published before anything is written, so that a refused PUBLISH changes
-- nothing.

--@include times
--@include hold
--@include rollback
--@include notify
check_ms(ARGV[3], ARGV[5])

local function free()
    notify(ARGV[4], KEYS[2], '0')
    redis.call('del', KEYS[1])
end
local function give_back()
    release_hold(KEYS[1], ARGV[1], ARGV[3], free)
end
return rolled_back(KEYS[1], ARGV[1], ARGV[2], KEYS[3], ARGV[5], give_back)
