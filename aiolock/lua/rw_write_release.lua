-- Release one write hold of a read-write lock: Redisson write unlock, with the unlock latch.
--
-- KEYS[1]  lock hash
-- KEYS[2]  channel "redisson_rwlock:{name}"
-- KEYS[3]  unlock latch "redisson_unlock_latch:{name}:<request id>"
-- ARGV[1]  write unlock message "1"
-- ARGV[2]  lease in ms to re-apply while write holds remain
-- ARGV[3]  write field "<holder>:write"
-- ARGV[4]  publish command: PUBLISH or SPUBLISH
-- ARGV[5]  latch TTL in ms
--
-- Returns nil if the holder has no write hold, 0 if write holds remain, 1 if the lock was
-- released (deleted, and "1" published), 2 if the write hold was released but this
-- holder's read holds remain: the lock is downgraded to mode=read and, as in Redisson,
-- NOTHING is published. A resend of the same call replays the first result from the latch.
--
-- Redisson semantics (spec 6.5); an unlock of a lock with no mode publishes "1" (a wake-up)
-- and reports "not held". Unlike Redisson, nothing is written to the latch on a nil reply.
--
-- The message is published before anything is written: a refused PUBLISH (ACL) then fails
-- the script with the hold still there, as the caller's bookkeeping assumes after an
-- error. Subscribers receive it after the script either way.
local done = redis.call('get', KEYS[3])
if done then
    return tonumber(done)
end
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    redis.call(ARGV[4], KEYS[2], ARGV[1])
    return nil
end
if mode ~= 'write' then
    return nil
end
local count = tonumber(redis.call('hget', KEYS[1], ARGV[3]))
if not count then
    return nil
end
if count > 1 then
    redis.call('hincrby', KEYS[1], ARGV[3], -1)
    redis.call('pexpire', KEYS[1], ARGV[2])
    redis.call('set', KEYS[3], 0, 'px', ARGV[5])
    return 0
end
if redis.call('hlen', KEYS[1]) == 2 then
    -- "mode" and this write field only: nothing holds the lock once the field goes.
    redis.call(ARGV[4], KEYS[2], ARGV[1])
    redis.call('del', KEYS[1])
    redis.call('set', KEYS[3], 1, 'px', ARGV[5])
    return 1
end
redis.call('hdel', KEYS[1], ARGV[3])
redis.call('hset', KEYS[1], 'mode', 'read')
redis.call('set', KEYS[3], 2, 'px', ARGV[5])
return 2
