-- Fragment seed: a semaphore declared with its permits gets them from the first acquire that
-- finds it without state (a restart without persistence, a failover to a replica that had
-- not seen them, a semaphore never set), as Redisson's trySetPermits would set them.
--
-- Expects: check_count (fragment counts).
-- Defines:
--   seed_permits(semaphore, permits)  permits is '' (not declared: nothing happens) or a
--     count; when the semaphore's key does not exist it is SET to that count, never over a
--     value anyone set (its permits taken or given are its state). Nothing is published:
--     the acquire that seeds takes at once, and wakes its own client's waiters for what it
--     leaves; a waiter of another client wakes at the next release, as after try_set_permits.
local function seed_permits(semaphore, permits)
    if permits == '' then
        return
    end
    check_count(permits, false)
    if redis.call('exists', semaphore) == 0 then
        redis.call('set', semaphore, permits)
    end
end
