-- Release one read hold of a read-write lock: Redisson read unlock, with the unlock latch.
--
-- KEYS[1]  lock hash
-- KEYS[2]  channel "redisson_rwlock:{name}"
-- KEYS[3]  this holder's timeout-key prefix "{name}:<holder>:rwlock_timeout"
-- KEYS[4]  the name's key prefix "{name}" (the bare name if it has a "{"): every holder's
--          timeout keys are "<KEYS[4]>:<field>:rwlock_timeout:<k>"
-- KEYS[5]  unlock latch "redisson_unlock_latch:{name}:<request id>"
-- ARGV[1]  read unlock message "0"
-- ARGV[2]  holder id
-- ARGV[3]  publish command: PUBLISH or SPUBLISH
-- ARGV[4]  latch TTL in ms
--
-- Returns nil if the holder has no read hold, 0 if it still has read holds, 1 if this was
-- its last one (the lock itself may still be held by other readers or by this holder's
-- write hold). A resend of the same call replays the first result from the latch.
--
-- Redisson semantics (spec 6.3): drop the holder's highest-numbered timeout key; while
-- other fields remain, the hash TTL becomes the longest PTTL among the timeout keys of
-- every field in the hash (other clients' and Java holders' included, which is why they
-- must be named exactly so); with no live read hold left the hash is deleted and "0"
-- published, unless a writer (this holder, downgrading) still holds it. An unlock of a
-- lock with no mode publishes "0" too (a wake-up) and reports "not held". The timeout
-- keys of other holders are named from the hash's fields, so they cannot be in KEYS;
-- the "{name}" hash tag keeps them in the lock's cluster slot.
--
-- Unlike Redisson, nothing is written to the latch on a nil reply: the latch is private to
-- this call, and a resend recomputes nil anyway.
--
-- Everything is decided before anything is written, and the message is published first:
-- a refused PUBLISH (ACL) then fails the script with the hold still there, as the
-- caller's bookkeeping assumes after an error. Subscribers receive it after the script
-- either way, and the state stored is the same as in Redisson's order.

--@include times
--@include latch
--@include rw_unlock_mode
--@include rw_read_unlock
check_ms(ARGV[4])

local function release()
    local mode = unlock_mode(ARGV[3], ARGV[1])
    if not mode then
        return nil
    end
    local held = tonumber(redis.call('hget', KEYS[1], ARGV[2]))
    if not held then
        return nil
    end
    drop_read_hold(ARGV[2], held, mode, ARGV[3], ARGV[1])
    if held == 1 then
        return 1
    end
    return 0
end
return latched(KEYS[5], ARGV[4], release)
