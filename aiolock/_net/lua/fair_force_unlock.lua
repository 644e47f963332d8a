-- Delete a fair lock whoever holds it and wake the waiter at the head: Redisson
-- RFairLock forceUnlock.
--
-- KEYS[1]  lock hash
-- KEYS[2]  queue "redisson_lock_queue:{name}"
-- KEYS[3]  timeouts "redisson_lock_timeout:{name}"
-- KEYS[4]  channel base "redisson_lock__channel:{name}"
-- ARGV[1]  unlock message "0"
-- ARGV[2]  now: the caller's wall clock in epoch ms
-- ARGV[3]  publish command
--
-- Returns 1 if a lock was deleted (and ARGV[1] published to "<base>:<head id>" if anyone
-- waits), else 0. The queue is left as it is, after the purge of expired waiters. Fails
-- with a WRONGTYPE error, changing nothing, if KEYS[1] holds another type: that is
-- somebody's data, not a lock (Redisson deletes it all the same).
--
-- Everything is read before anything is written, and the message is published first: a
-- refused PUBLISH (ACL) then fails the script with nothing changed. Subscribers receive it
-- after the script either way, and the state stored is the same as in Redisson's order.

--@include fair_purge

local kind = redis.call('type', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
local expired, head = expired_waiters(tonumber(ARGV[2]))
if kind == 'hash' and head then
    redis.call(ARGV[3], KEYS[4] .. ':' .. head, ARGV[1])
end
pop_waiters(expired)
if kind == 'none' then
    return 0
end
redis.call('del', KEYS[1])
return 1
