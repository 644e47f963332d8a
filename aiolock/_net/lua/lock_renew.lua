-- Watchdog renewal of a batch of hash-held locks (Redisson LockTask).
--
-- KEYS[i]    lock hash i (at most 100 per call; all in one cluster slot)
-- ARGV[1]    lease in ms
-- ARGV[i+1]  the holder field registered for KEYS[i]
--
-- Returns one entry per key: 1 if the holder still held it and the lease was renewed,
-- 0 if its hold is gone (the lease ran out or was taken), so the caller marks it lost.
-- A key that now holds another type counts as gone (pcall): one such key must not fail
-- the renewal of the other locks in its batch.

--@include times
--@include renew
check_ms(ARGV[1])

local function renew(i)
    if redis.pcall('hexists', KEYS[i], ARGV[i + 1]) ~= 1 then
        return false
    end
    redis.call('pexpire', KEYS[i], ARGV[1])
    return true
end
return renew_each(#KEYS, renew)
