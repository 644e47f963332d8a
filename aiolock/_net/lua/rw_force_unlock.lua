-- Delete a read-write lock held in the given mode, whoever holds it, and wake its waiters:
-- Redisson readLock().forceUnlock() / writeLock().forceUnlock() (spec 6.6).
--
-- KEYS[1]  lock hash
-- KEYS[2]  channel "redisson_rwlock:{name}"
-- KEYS[3]  the name's key prefix "{name}" (see rw_read_release.lua)
-- ARGV[1]  the mode it must be in: "read" or "write"
-- ARGV[2]  message: "0" for read, "1" for write
-- ARGV[3]  publish command
--
-- Returns 1 if the lock was in that mode and was deleted (and the message published),
-- else 0 (nothing changed). Redisson leaves the read holds' timeout keys to expire; aiolock
-- deletes them with the hash. Nothing reads a timeout key whose field is gone, so this
-- only removes garbage early. A key of another type fails HGET with WRONGTYPE before
-- anything is written.
--
-- The message is published before anything is deleted: a refused PUBLISH (ACL) then fails
-- the script with nothing changed. Subscribers receive it after the script either way.
if redis.call('hget', KEYS[1], 'mode') ~= ARGV[1] then
    return 0
end
redis.call(ARGV[3], KEYS[2], ARGV[2])
local fields = redis.call('hgetall', KEYS[1])
for i = 1, #fields, 2 do
    local holds = tonumber(fields[i + 1])
    if holds then
        for k = holds, 1, -1 do
            redis.call('del', KEYS[3] .. ':' .. fields[i] .. ':rwlock_timeout:' .. k)
        end
    end
end
redis.call('del', KEYS[1])
return 1
