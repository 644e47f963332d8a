-- Delete a lock whoever holds it and wake its waiters: Redisson forceUnlock.
--
-- KEYS[1]  lock hash
-- KEYS[2]  lock channel
-- ARGV[1]  unlock message "0"
-- ARGV[2]  publish command, or '' for none (the spin lock)
--
-- Returns 1 if a lock was deleted (and the message published), else 0. Fails with a
-- WRONGTYPE error, changing nothing, if KEYS[1] holds another type: that is somebody's
-- data, not a lock (Redisson deletes it all the same).
--
-- The message is published before the key is deleted: a refused PUBLISH (ACL) then fails
-- the script with nothing changed. Subscribers receive it after the script either way.

--@include notify
--@include forced

local refusal = refuse_force(KEYS[1])
if refusal ~= nil then
    return refusal
end
notify(ARGV[2], KEYS[2], ARGV[1])
redis.call('del', KEYS[1])
return 1
