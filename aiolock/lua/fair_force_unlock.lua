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
-- waits), else 0. The queue is left as it is, after the purge of expired waiters.
local now = tonumber(ARGV[2])
while true do
    local head = redis.call('lindex', KEYS[2], 0)
    if not head then
        break
    end
    local deadline = tonumber(redis.call('zscore', KEYS[3], head))
    if deadline == nil or deadline > now then
        break
    end
    redis.call('zrem', KEYS[3], head)
    redis.call('lpop', KEYS[2])
end
if redis.call('del', KEYS[1]) == 1 then
    local head = redis.call('lindex', KEYS[2], 0)
    if head then
        redis.call(ARGV[3], KEYS[4] .. ':' .. head, ARGV[1])
    end
    return 1
end
return 0
