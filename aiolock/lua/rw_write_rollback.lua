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
local count = redis.call('hget', KEYS[1], ARGV[1])
if not count or tonumber(count) ~= tonumber(ARGV[2]) then
    redis.call('set', KEYS[3], 1, 'px', ARGV[5])
    return 0
end
if tonumber(count) > 1 then
    redis.call('hincrby', KEYS[1], ARGV[1], -1)
    redis.call('pexpire', KEYS[1], ARGV[3])
elseif redis.call('hlen', KEYS[1]) == 2 then
    -- "mode" and this write field only: nothing holds the lock once the field goes.
    redis.call(ARGV[4], KEYS[2], '1')
    redis.call('del', KEYS[1])
else
    redis.call('hdel', KEYS[1], ARGV[1])
    redis.call('hset', KEYS[1], 'mode', 'read')
end
redis.call('set', KEYS[3], 1, 'px', ARGV[5])
return 1
