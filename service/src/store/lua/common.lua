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
-- ARGV[2] = explicit clock in µs (tests) or '' for Redis's TIME.
local explicit_clock = ARGV[2] ~= nil and ARGV[2] ~= ''
-- A key expires when its state is as good as fresh. Under a test's explicit clock, which
-- runs slower than Redis's, keys are kept 10 minutes longer so they do not vanish early.
local function ttl_ms(us)
  local ms = ceil_div(us, 1000); if ms < 1 then ms = 1 end
  if explicit_clock then ms = ms + 600000 end
  return int(ms)
end
local function clock()
  if explicit_clock then return tonumber(ARGV[2]) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local now = clock()
-- One decision: {allowed, remaining, reset_after, retry_after, delay}.
local function reply(allowed, remaining, reset, retry, delay)
  return {allowed and 1 or 0, remaining, reset, retry, delay or 0}
end
-- Each algorithm: `keys` (how many state keys it takes), and
-- `decide(k, limit, p, cost)` → a reply and, when it admits, a function that writes the new
-- state (called only if the whole request passes); `refund(k, limit, p, at, cost)` gives
-- back `cost` admitted at `at`. `k` holds the rule's keys, `p` its derived numbers.
local algorithms = {}
