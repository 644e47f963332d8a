-- Watchdog renewal of a batch of permits of permit-expirable semaphores (aiolock's own:
-- Redisson's permits are never renewed, their holders call updateLeaseTime).
--
-- KEYS[i]    "{name}:timeout" of permit i's semaphore (at most 100 per call; one slot)
-- ARGV[1]    lease in ms
-- ARGV[i+1]  permit i's id (16 raw bytes)
--
-- Returns one entry per permit: 1 if it was still taken and its expiry (score) is now the
-- server's clock plus the lease, 0 if it is gone (released, reclaimed, deleted) or its
-- lease ran out already: the caller reports it lost. An expired permit is never revived:
-- any client's next script may reclaim it, and another holder may have its place by then.
-- A key that now holds another type counts as gone (pcall).

--@include times
--@include clock
--@include renew
check_ms(ARGV[1])

local now = server_ms()
local expiry = now + tonumber(ARGV[1])
local function renew(i)
    local score = redis.pcall('zscore', KEYS[i], ARGV[i + 1])
    if type(score) ~= 'string' or tonumber(score) <= now then
        return false
    end
    redis.call('zadd', KEYS[i], 'xx', expiry, ARGV[i + 1])
    return true
end
return renew_each(#KEYS, renew)
