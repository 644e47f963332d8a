-- Fragment hand_over: a holder's last hold on a hash lock written over to an heir, a waiter of
-- the releasing client (see aiolock/_handover.py), instead of freeing the lock.
--
-- Expects: nothing (keys and values are arguments).
-- Defines:
--   hand_over(hash, field, heir, lease)
--     field's hold goes and heir gets one, with lease ms on the hash. The lock is never
--     free, so nothing is published: the state stays Redisson's, and no waiter anywhere
--     runs an attempt for a lock it could not get. The caller has checked that heir has
--     no field of its own and that field's was the lock's only hold.
local function hand_over(hash, field, heir, lease)
    redis.call('hdel', hash, field)
    redis.call('hset', hash, heir, 1)
    redis.call('pexpire', hash, lease)
end
