-- Acquire (or re-enter) a reentrant lock: Redisson RLock layout; with a token counter, a
-- fenced lock (RFencedLock: the same hash, plus a counter every acquisition advances).
--
-- KEYS[1]  lock hash: holder id -> reentrancy count
-- KEYS[2]  cancel tombstone of this acquire call (written by lock_rollback.lua)
-- KEYS[3]  (fenced lock only) token counter "redisson_lock_token:{name}"
-- ARGV[1]  lease in ms
-- ARGV[2]  holder id "<client uuid>:<n>"
-- ARGV[3]  the count this holder has once this call succeeds (its local count + 1)
--
-- Returns {1, count} when acquired (count = the holder's count after this call; a fenced
-- lock adds its token: {1, count, token}), or {0, pttl} when another holder has it (pttl =
-- ms left on its lease, -1 without expiry), or {-1, 0} when this call was already
-- cancelled and rolled back, or {-2, count} when the holder's count is not the ARGV[3] - 1
-- it believes it has (a hold it lost without knowing): nothing is taken, and the caller
-- corrects its belief and tries again.
--
-- ARGV[3] makes a resent call idempotent: if the first send already took the hold, the
-- field already equals the target count, so the resend refreshes the lease and does not
-- count twice (nor take a second token: it answers the counter as it stands, which is the
-- token the first send took, as nobody else can have taken one since: the lock is this
-- holder's, and the holder's calls run one after another). A hold is only ever taken from
-- ARGV[3] - 1, so a rollback that finds the target count knows this call took it. The
-- stored state is exactly Redisson's; only the return value carries more.
--
-- The token counter never expires, as Redisson's (its issue #6510: leftover keys): Java
-- clients INCR the same key and never refresh a TTL, so an expiry set here would end the
-- counter under them and their next token would be 1. A counter that is absent (never
-- used, or deleted by hand) starts from the server's clock in microseconds, above every
-- token a counter deleted earlier gave, so tokens only grow.

--@include times
--@include settled
check_ms(ARGV[1])

-- The common case first: a first hold (ARGV[3] is 1) on a free lock, for a call not rolled
-- back. One EXISTS over the hash and the tombstone answers all three, where the general
-- path below asks three times: the two calls saved are 9 % of the server's instructions
-- for an uncontended acquire+release (callgrind, Valkey 8.1). Any other state takes the
-- general path, which judges it in full.
local free = ARGV[3] == '1' and redis.call('exists', KEYS[1], KEYS[2]) == 0
if not free then
    local reply, count = settled(KEYS[1], ARGV[2], ARGV[3], ARGV[1])
    if reply then
        if KEYS[3] and reply[1] == 1 then
            reply[3] = tonumber(redis.call('get', KEYS[3]))
        end
        return reply
    end
    if not count and redis.call('exists', KEYS[1]) == 1 then
        return {0, redis.call('pttl', KEYS[1])}
    end
    -- About to take a hold: unless this call was cancelled and rolled back already.
    if redis.call('exists', KEYS[2]) == 1 then
        return {-1, 0}
    end
end
local token
if KEYS[3] then
    if redis.call('exists', KEYS[3]) == 0 then
        local now = redis.call('time')
        redis.call('set', KEYS[3], now[1] .. string.format('%06d', tonumber(now[2])))
    end
    token = redis.call('incr', KEYS[3])
end
local count = redis.call('hincrby', KEYS[1], ARGV[2], 1)
redis.call('pexpire', KEYS[1], ARGV[1])
return {1, count, token}
