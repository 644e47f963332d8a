-- Watchdog renewal of a batch of read holds (Redisson ReadLockTask, 4.4+ semantics).
--
-- KEYS[2i-1]  lock hash of hold i (at most 100 holds per call; all in one cluster slot)
-- KEYS[2i]    hold i's holder's timeout-key prefix "{name}:<holder>:rwlock_timeout"
-- ARGV[1]     lease in ms
-- ARGV[i+1]   hold i's holder id (its read field)
--
-- Returns one entry per hold: 1 if the holder still has read holds (then each of ITS
-- timeout keys "<prefix>:k", k = count..1, gets the lease, and the hash a TTL of at least
-- the lease), 0 if its field is gone (lost). Only the holder's own timeout keys are
-- touched, never another client's (Redisson 3.44 to 4.3 renewed every holder's: PR #7098).
-- The hash TTL is raised to the lease but never lowered, so a longer explicit lease of
-- another reader is not cut short. A key of another type counts as gone (pcall).
local renewed = {}
for i = 1, #KEYS / 2 do
    local key = KEYS[2 * i - 1]
    local count = redis.pcall('hget', key, ARGV[i + 1])
    local holds = nil
    if type(count) == 'string' then
        holds = tonumber(count)
    end
    if holds and holds > 0 then
        for k = holds, 1, -1 do
            redis.call('pexpire', KEYS[2 * i] .. ':' .. k, ARGV[1])
        end
        if redis.call('pttl', key) < tonumber(ARGV[1]) then
            redis.call('pexpire', key, ARGV[1])
        end
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
