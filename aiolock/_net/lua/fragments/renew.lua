-- Fragment renew: the reply of a watchdog renewal of a batch of holds.
--
-- Expects: nothing.
-- Defines:
--   renew_each(n, renew) -> {1 or 0, ...}
--     renew(i) for i = 1 .. n, in order; entry i is 1 if it renewed hold i (true), 0 if the
--     hold is gone (false), so the caller marks it lost.
local function renew_each(n, renew)
    local renewed = {}
    for i = 1, n do
        if renew(i) then
            renewed[i] = 1
        else
            renewed[i] = 0
        end
    end
    return renewed
end
