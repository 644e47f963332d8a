-- Delete a lock whoever holds it and wake its waiters: Redisson forceUnlock.
--
-- KEYS[1]  lock hash
-- KEYS[2]  lock channel
-- ARGV[1]  unlock message "0"
-- ARGV[2]  publish command
--
-- Returns 1 if a lock was deleted (and the message published), else 0.
if redis.call('del', KEYS[1]) == 1 then
    redis.call(ARGV[2], KEYS[2], ARGV[1])
    return 1
end
return 0
