-- Fragment latch: the unlock latch, which makes a release safe to resend. Redisson writes one
-- per unlock request ("redisson_unlock_latch:{name}:<request id>") for the same reason.
--
-- Expects: nothing (the latch key and its TTL are arguments).
-- Defines:
--   latched(latch, ttl, release) -> the release's reply
--     A latch already there is a copy of this call that ran before: its value is the reply,
--     and nothing else runs. Otherwise release() runs, and its reply, unless nil, is kept in
--     the latch for ttl ms, written after everything else. Unlike Redisson, a nil reply
--     ("not held") is not kept: a resend recomputes it anyway.
local function latched(latch, ttl, release)
    local done = redis.call('get', latch)
    if done then
        return tonumber(done)
    end
    local result = release()
    if result ~= nil then
        redis.call('set', latch, result, 'px', ttl)
    end
    return result
end
