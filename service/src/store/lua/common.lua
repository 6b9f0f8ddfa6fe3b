-- Shared helpers, first in the check script. Numbers are doubles; every value stays an
-- integer below 2^53, so these helpers are exact.
-- Floor division. For integers |a| < 2^53 and b >= 1, a / b rounds by less than 1/b, never
-- across an integer, so Lua's `a % b` (a - floor(a / b) * b) is exact, and so is the rest.
-- (The hot paths write it out, `(a - a % b) / b`: a Lua call costs more than the division.)
local function idiv(a, b) return (a - a % b) / b end
local function ceil_div(a, b) return idiv(a + b - 1, b) end
-- Lua's string functions, bound at a call's first step (a Function library cannot reach
-- them while it loads): an upvalue costs less than a global, which Redis finds through two
-- tables. A number is read from text as `text + 0`, which parses it once (`tonumber`, twice).
local format, match
-- '%d' is exact for these integers and a third of the cost of '%.0f' (one format of a
-- whole value costs a third of several joined).
local function int(x) return format('%d', x) end
-- The clock of the call being run, set by `begin` first thing in every call: an explicit
-- clock in µs (tests) or '' for Redis's TIME. (Module state, as a Function library keeps it
-- between calls: Redis runs one call at a time.)
local now, explicit_clock
-- The one-key states (every algorithm but the sliding log) a call has read, by key (false
-- for none), and those it changed: each is read at most once a call (`load`, or `prefetch`
-- for many in one MGET) and written at most once, at its end (`finish`), however many
-- checks of a batch or probes of a grant touch it. A call that fails writes nothing.
-- The tables outlive a call (a library's calls reuse them: a new table costs Redis more
-- than clearing a few keys), so `begin` clears what the last call left: `loaded` lists
-- the keys read (the first `n_loaded`), and only a key read can be written.
local cache, ttls, loaded, written = {}, {}, {}, {}
local n_loaded, n_written = 0, 0
local function begin(clock)
  if not format then format, match = string.format, string.match end
  explicit_clock = clock ~= ''
  if explicit_clock then now = clock + 0 else
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
  end
  for i = 1, n_loaded do local k = loaded[i]; cache[k] = nil; ttls[k] = nil end
  n_loaded, n_written = 0, 0
end
local function load(k)
  local v = cache[k]
  if v == nil then
    v = redis.call('GET', k) or false
    cache[k], n_loaded = v, n_loaded + 1; loaded[n_loaded] = k
  end
  return v or nil
end
-- Reads keys[1..n] at once.
local function prefetch(keys, n)
  if n < 2 then return end
  for first = 1, n, 1000 do -- `unpack` is bounded by Lua's stack
    local last = math.min(first + 999, n)
    local values = redis.call('MGET', unpack(keys, first, last))
    for i = first, last do
      local k = keys[i]
      cache[k], n_loaded = values[i - first + 1] or false, n_loaded + 1; loaded[n_loaded] = k
    end
  end
end
-- Keeps `v` as k's state (k read by this call); `ttl` (µs from now) when the key must live
-- that long, nil when the TTL it already has is right (a refund, a window's later admissions).
local function store(k, v, ttl)
  cache[k] = v
  if ttls[k] == nil then n_written = n_written + 1; written[n_written] = k; ttls[k] = -1 end
  if ttl and ttl > ttls[k] then ttls[k] = ttl end
end
-- A key expires when its state is as good as fresh. Under a test's explicit clock, which
-- runs slower than Redis's, keys are kept 10 minutes longer so they do not vanish early.
local function ttl_ms(us)
  local ms = us + 999; ms = (ms - ms % 1000) / 1000; if ms < 1 then ms = 1 end
  if explicit_clock then ms = ms + 600000 end
  return int(ms)
end
-- Writes what the call changed, each key once.
local function finish()
  for i = 1, n_written do
    local k = written[i]
    if ttls[k] >= 0 then redis.call('SET', k, cache[k], 'PX', ttl_ms(ttls[k]))
    else redis.call('SET', k, cache[k], 'KEEPTTL') end
  end
  n_written = 0
end
-- Each algorithm is a function that builds it, so a call pays only for the algorithms it
-- uses. What it builds: `keys`, how many state keys it takes; `windowed`, whether its state
-- starts anew with each window (a lease of it ends with the window);
-- `decide(k1, k2, limit, a, b, c, cost)` → allowed, remaining, reset_after, retry_after,
-- delay and, when it admits, the new state and its TTL (µs, or nil to keep the key's),
-- which `commit(k1, state, ttl, k2)` writes if the whole request passes (one-key states:
-- `store`); `refund(k1, k2, limit, a, b, c, at, cost)` gives back `cost`
-- admitted at `at`. k1, k2 are the rule's keys (k2 unused by one-key states); a, b, c its
-- derived numbers. Everything is passed and returned by value: tables cost more in Redis.
local algorithms = {}
