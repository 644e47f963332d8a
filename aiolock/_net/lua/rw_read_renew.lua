-- Watchdog renewal of a batch of read holds (Redisson ReadLockTask, 4.4+ semantics).
--
-- KEYS[2i-1]  lock hash of holder i (at most 100 per call; all in one cluster slot)
-- KEYS[2i]    holder i's timeout-key prefix "{name}:<holder>:rwlock_timeout"
-- ARGV[1]     lease in ms
-- ARGV[2i]    holder i's id (its read field)
-- ARGV[2i+1]  the read holds of holder i that the watchdog keeps alive, as a comma list of
--             their numbers k ("1,2"): hold k is the string key "<prefix>:k"
--
-- Returns one entry per holder: 1 if every listed hold is still alive (then each gets the
-- lease, and the hash a TTL of at least the lease), 0 if the field is gone or one of those
-- holds' own timeout keys has run out: that hold is dead even though the field is there
-- (another reader's release would free the lock under it), so the caller reports it lost.
-- Holds taken with an explicit lease are not in the list: they are never renewed. Only
-- the holder's own timeout keys are touched, never another client's (Redisson 3.44 to 4.3
-- renewed every holder's: PR #7098). The hash TTL is raised to the lease but never
-- lowered, so a longer explicit lease of another reader is not cut short. A key of
-- another type counts as gone (pcall).

--@include times
--@include renew
check_ms(ARGV[1])

local function renew(i)
    local key = KEYS[2 * i - 1]
    local count = redis.pcall('hget', key, ARGV[2 * i])
    local holds = nil
    if type(count) == 'string' then
        holds = tonumber(count)
    end
    local alive = holds ~= nil and holds > 0
    if alive then
        for k in string.gmatch(ARGV[2 * i + 1], '%d+') do
            if tonumber(k) > holds or redis.call('pexpire', KEYS[2 * i] .. ':' .. k, ARGV[1]) == 0 then
                alive = false
            end
        end
    end
    if alive and redis.call('pttl', key) < tonumber(ARGV[1]) then
        redis.call('pexpire', key, ARGV[1])
    end
    return alive
end
return renew_each(#KEYS / 2, renew)
