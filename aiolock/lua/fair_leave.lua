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
-- if the head changed while the lock is free, publishes ARGV[4] to the new head: a holder
-- that gave up right after the release was published to it would otherwise leave the next
-- waiter asleep until its wait bound. Resending it is harmless (the holder is not found).
--
-- Everything is decided before anything is written, and the message is published first:
-- a refused PUBLISH (ACL) then fails the script with nothing changed. Subscribers receive
-- it after the script either way, and the state stored is the same as in the order above.
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
local w = tonumber(ARGV[2])
local now = tonumber(ARGV[3])

-- The queue once the holder has left it, with what each waiter behind it moves up by...
local moved = {}
for i = at + 1, #queue do
    moved[queue[i]] = (moved[queue[i]] or 0) + w
end
local rest = {}
for i = 1, #queue do
    if queue[i] ~= ARGV[1] then
        rest[#rest + 1] = queue[i]
    end
end
-- ... then the purge, read-only: how many expired waiters it pops from the head.
local popped, seen = 0, {}
while popped < #rest do
    local id = rest[popped + 1]
    local deadline = tonumber(redis.call('zscore', KEYS[3], id))
    if moved[id] then
        deadline = (deadline or 0) - moved[id]
    end
    -- A popped id has no deadline left: the purge would stop at a second copy of it.
    if deadline == nil or deadline > now or seen[id] then
        break
    end
    seen[id] = true
    popped = popped + 1
end
local head = rest[popped + 1]
if (at == 1 or popped > 0) and head and redis.call('exists', KEYS[1]) == 0 then
    redis.call(ARGV[5], KEYS[4] .. ':' .. head, ARGV[4])
end

for i = at + 1, #queue do
    redis.call('zincrby', KEYS[3], -w, queue[i])
end
redis.call('zrem', KEYS[3], ARGV[1])
redis.call('lrem', KEYS[2], 0, ARGV[1])
for i = 1, popped do
    redis.call('zrem', KEYS[3], rest[i])
    redis.call('lpop', KEYS[2])
end
return 1
