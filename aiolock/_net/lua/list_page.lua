-- Read a page of names for `aiolock list`: per name, what tells a plain lock or counter apart
-- and what the listing shows of it, in one run instead of three commands a name.
--
-- KEYS[5i-4..5i]  per name i: the object's own key, its fair queue, its fair timeout set,
--                 its fencing token and its permit-expiry set ("{name}:timeout")
-- ARGV[i]         per name i: 'hash' or 'string', the own key's type as the scan found it
--
-- Returns one entry per name: {data, pttl, rarer}. data: HGETALL's flat list for a hash,
-- GET's value (false if gone) for a string; pttl: the own key's PTTL; rarer: how many keys
-- of the rarer kinds exist (a fair lock's, a fencing token, a permit-expiry set: the caller
-- reads that name as inspect does), or -1 when the key changed type since the scan.
--
-- Read-only: it writes nothing, so a resend or a run cut off changes nothing. Single-server
-- only (its keys span slots); on a cluster the caller reads names one by one.
local out = {}
for i = 1, #ARGV do
    local base = 5 * (i - 1)
    local key = KEYS[base + 1]
    local data
    if ARGV[i] == 'hash' then
        data = redis.pcall('hgetall', key)
    else
        data = redis.pcall('get', key)
    end
    if type(data) == 'table' and data.err then
        out[i] = {false, -2, -1}
    else
        local rarer = redis.call('exists', KEYS[base + 2], KEYS[base + 3], KEYS[base + 4],
            KEYS[base + 5])
        out[i] = {data, redis.call('pttl', key), rarer}
    end
end
return out
