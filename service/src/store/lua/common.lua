-- Shared helpers, first in the check script. Numbers are doubles; every value stays an
-- integer below 2^53, so these helpers are exact.
local function idiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1 elseif r >= b then q = q + 1 end
  return q
end
local function ceil_div(a, b) return idiv(a + b - 1, b) end
local function int(x) return string.format('%.0f', x) end
-- The clock of the call being run, set by `set_clock` first thing in every call: an
-- explicit clock in µs (tests) or '' for Redis's TIME. (Module state, as a Function library
-- keeps it between calls: Redis runs one call at a time.)
local now, explicit_clock
local function set_clock(arg)
  explicit_clock = arg ~= ''
  if explicit_clock then now = tonumber(arg) else
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
end
-- A key expires when its state is as good as fresh. Under a test's explicit clock, which
-- runs slower than Redis's, keys are kept 10 minutes longer so they do not vanish early.
local function ttl_ms(us)
  local ms = ceil_div(us, 1000); if ms < 1 then ms = 1 end
  if explicit_clock then ms = ms + 600000 end
  return int(ms)
end
-- Each algorithm is a function that builds it, so a call pays only for the algorithms it
-- uses. What it builds: `keys`, how many state keys it takes;
-- `decide(k1, k2, limit, a, b, c, cost)` → allowed, remaining, reset_after, retry_after,
-- delay and, when it admits, a function that writes the new state (called only if the
-- whole request passes); `refund(k1, k2, limit, a, b, c, at, cost)` gives back `cost`
-- admitted at `at`. k1, k2 are the rule's keys (k2 unused by one-key states); a, b, c its
-- derived numbers. Everything is passed and returned by value: tables cost more in Redis.
local algorithms = {}
