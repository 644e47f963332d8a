-- Fragment clock: the server's clock, the one clock every client's script agrees on.
--
-- Expects: nothing.
-- Defines:
--   server_ms() -> the server's clock in epoch ms
local function server_ms()
    local now = redis.call('time')
    return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
