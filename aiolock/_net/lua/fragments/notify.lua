-- Fragment notify: publish a lock's message, or nothing for a lock nobody subscribes to.
--
-- Expects: nothing (command, channel and message are arguments).
-- Defines:
--   notify(command, channel, message)
--     PUBLISH or SPUBLISH ``message`` on ``channel``; an empty command publishes nothing
--     (the spin lock: Redisson's RSpinLock never publishes, its waiters poll).
local function notify(command, channel, message)
    if command ~= '' then
        redis.call(command, channel, message)
    end
end
