-- A waiter gives up (its try_lock wait ran out, or it was cancelled or failed): it leaves
-- the queue at once, Redisson RFairLock acquireFailed.
--
-- KEYS[1]  lock hash
-- KEYS[2]  queue "redisson_lock_queue:{name}"
-- KEYS[3]  timeouts "redisson_lock_timeout:{name}"
-- KEYS[4]  channel base "redisson_lock__channel:{name}"
-- ARGV[1]  holder id
-- ARGV[2]  W of the call that gives up, in ms (the one its acquire attempts were sent with)
-- ARGV[3]  now: the caller's wall clock in epoch ms
-- ARGV[4]  unlock message "0"
-- ARGV[5]  publish command
--
-- Returns 1 if the holder was queued (and is not any more), else 0.
--
-- As Redisson: every waiter behind the holder moves up by W (their deadlines were counted
-- from its deadline, which was counted with W), then the holder is removed from the
-- timeouts and the queue. Unlike Redisson, it then purges expired waiters at the head and,
-- if the head changed while the lock is free, publishes ARGV[1] to the new head: a holder
-- that gave up right after the release was published to it would otherwise leave the next
-- waiter asleep until its wait bound. Resending it is harmless (the holder is not found).
local queue = redis.call('lrange', KEYS[2], 0, -1)
local at = 1
while at <= #queue and queue[at] ~= ARGV[1] do
    at = at + 1
end
if at > #queue then
    -- Not queued; drop a stray deadline all the same, as Redisson does.
    redis.call('zrem', KEYS[3], ARGV[1])
    return 0
end
for i = at + 1, #queue do
    redis.call('zincrby', KEYS[3], -tonumber(ARGV[2]), queue[i])
end
redis.call('zrem', KEYS[3], ARGV[1])
redis.call('lrem', KEYS[2], 0, ARGV[1])

local head_changed = at == 1
local now = tonumber(ARGV[3])
while true do
    local head = redis.call('lindex', KEYS[2], 0)
    if not head then
        break
    end
    local deadline = tonumber(redis.call('zscore', KEYS[3], head))
    if deadline == nil or deadline > now then
        break
    end
    redis.call('zrem', KEYS[3], head)
    redis.call('lpop', KEYS[2])
    head_changed = true
end
if head_changed and redis.call('exists', KEYS[1]) == 0 then
    local head = redis.call('lindex', KEYS[2], 0)
    if head then
        redis.call(ARGV[5], KEYS[4] .. ':' .. head, ARGV[4])
    end
end
return 1
