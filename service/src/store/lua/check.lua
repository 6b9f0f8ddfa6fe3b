-- The driver: decides one request against every rule it names, all-or-nothing, mirroring
-- sluice-core's `decide_all`. The request passes when every enforced rule admits it; only
-- then does each rule that admitted it (shadow rules too) keep its new state.
-- `run(op, KEYS, ARGV, base)`: op 'decide' | 'peek' | 'refund' | 'grant' | 'take' |
-- 'giveback' | 'release' | 'renew' (a concurrency rule's slots at ARGV[base + 1]: {now, the
-- slots found}); ARGV[base] the clock (see common); ARGV[base + 1] for a refund the time the
-- admissions were made at, for a grant the lease's length (otherwise unused); then one
-- value per rule, "<algorithm>:<shadow 1/0>:<cost>:<limit>:<a>:<b>:<c>": the request's cost
-- to it (a grant: what is asked; a giveback: what is returned), the limit and its three
-- derived numbers. KEYS: each rule's state keys in turn, then for a grant or giveback the
-- lease's record ("<units>:<granted at>:<end>"). The script calls it with the op first in
-- ARGV (base 2); the Function library has an entry point per op (base 1).
-- 'decide' returns {now, then allowed, remaining, reset, retry, delay per rule}; 'peek' the
-- same, keeping nothing; 'take' is a grant with no lease record (a cost learnt afterwards),
-- answering the decision a next request of cost 1 would get.
local built = {}
-- The algorithm named `name`, built once (per call of a script, once for a library).
local function algorithm_of(name)
  local algorithm = built[name]
  if not algorithm then
    if not algorithms[name] then error('unknown algorithm ' .. name) end
    algorithm = algorithms[name]()
    built[name] = algorithm
  end
  return algorithm
end
-- A rule's value read: {algorithm, shadow, cost, limit, a, b, c}. A node sends the same few
-- values again and again, so a library keeps what it read (a few thousand at most).
local rules, rules_read = {}, 0
local function rule_of(value)
  local rule = rules[value]
  if rule then return rule end
  local name, shadow, cost, limit, a, b, c = match(value, '^([%a_]+):([01]):(%d+):(%d+):(%d+):(%d+):(%d+)$')
  if not name then error('bad rule value ' .. value) end
  rule = {algorithm_of(name), shadow == '1', cost + 0, limit + 0, a + 0, b + 0, c + 0}
  if rules_read >= 4096 then rules, rules_read = {}, 0 end
  rules[value], rules_read = rule, rules_read + 1
  return rule
end
-- Reads at once (one MGET) the one-key states of the rules of ARGV[first..last], whose keys
-- start at KEYS[1].
local scratch = {}
local function prefetch_rules(KEYS, ARGV, first, last)
  local n, key = 0, 1
  for i = first, last do
    local algorithm = (rules[ARGV[i]] or rule_of(ARGV[i]))[1]
    if algorithm.keys == 1 then n = n + 1; scratch[n] = KEYS[key] end
    key = key + algorithm.keys
  end
  prefetch(scratch, n)
end
-- A call's answer, {now, then five numbers per rule} (`n_out` of them, nil after), and a
-- check's new states waiting for its verdict (five values each: algorithm, its two keys,
-- state, TTL). Both outlive a call, like the state cache.
local out, n_out, pending = {}, 0, {}
local function answer_begin()
  if n_out > 4096 then out = {} end -- a huge batch's answer is not kept
  out[1], n_out = now, 1
end
local function answer_end()
  out[n_out + 1] = nil
  return out
end
-- One check: decides the rules of ARGV[first..last] (one value each) on their keys from
-- KEYS[key] on, appends five numbers per rule to the answer, and when every enforced rule
-- admits it keeps their new states ('decide'; 'peek' keeps nothing). The next check's first
-- key.
local function decide_check(op, KEYS, key, ARGV, first, last)
  local n_pending, passes = 0, true
  for i = first, last do
    local rule = rules[ARGV[i]] or rule_of(ARGV[i])
    local algorithm = rule[1]
    local k1, k2 = KEYS[key], KEYS[key + 1]
    key = key + algorithm.keys
    local allowed, remaining, reset, retry, delay, state, ttl = algorithm.decide(k1, k2, rule[4], rule[5], rule[6], rule[7], rule[3])
    if allowed then
      pending[n_pending + 1], pending[n_pending + 2], pending[n_pending + 3], pending[n_pending + 4] = algorithm, k1, k2, state
      pending[n_pending + 5], n_pending = ttl, n_pending + 5
    elseif not rule[2] then passes = false end
    local n = n_out
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = allowed and 1 or 0, remaining, reset, retry, delay
    n_out = n + 5
  end
  if passes and op == 'decide' then
    for j = 1, n_pending, 5 do pending[j].commit(pending[j + 1], pending[j + 3], pending[j + 4], pending[j + 2]) end
  end
  return key
end
-- 'batch' (the library only): several checks that reached a node together, each decided
-- in turn and each all-or-nothing. ARGV[1] the clock, ARGV[2] the number of checks n,
-- ARGV[3 .. 2 + n] each check's number of rules, then every rule's value in order; KEYS
-- each check's keys in turn. Returns {now, then five numbers per rule}.
local function batch(KEYS, ARGV)
  begin(ARGV[1])
  local n = ARGV[2] + 0
  local key, first = 1, 3 + n
  answer_begin()
  prefetch_rules(KEYS, ARGV, first, #ARGV)
  for check = 1, n do
    local last = first - 1 + ARGV[2 + check]
    key = decide_check('decide', KEYS, key, ARGV, first, last)
    first = last + 1
  end
  finish()
  return answer_end()
end
local function run_op(op, KEYS, ARGV, base)
  if op == 'decide' or op == 'peek' then
    answer_begin()
    prefetch_rules(KEYS, ARGV, base + 2, #ARGV)
    decide_check(op, KEYS, 1, ARGV, base + 2, #ARGV)
    return answer_end()
  end
  local at = ARGV[base + 1] + 0
  local next_key = 1
  for i = base + 2, #ARGV do
    local rule = rule_of(ARGV[i])
    local algorithm = rule[1]
    local k1, k2 = KEYS[next_key], KEYS[next_key + 1]
    next_key = next_key + algorithm.keys
    local cost, limit, a, b, c = rule[3], rule[4], rule[5], rule[6], rule[7]
    if op == 'grant' or op == 'take' then
      -- Mirrors sluice-core's lease::grant and lease_end: the most the rule admits now, up to
      -- what is asked, taken at once; a windowed rule's lease ends with its window.
      local allowed, remaining, reset, retry, delay, state, ttl = algorithm.decide(k1, k2, limit, a, b, c, cost)
      local units = cost
      if not allowed then
        local lo, hi = 0, remaining
        if hi > cost - 1 then hi = cost - 1 end
        while lo < hi do
          local mid = lo + idiv(hi - lo + 1, 2)
          if (algorithm.decide(k1, k2, limit, a, b, c, mid)) then lo = mid else hi = mid - 1 end
        end
        units = lo
        local n = units; if n < 1 then n = 1 end
        allowed, remaining, reset, retry, delay, state, ttl = algorithm.decide(k1, k2, limit, a, b, c, n)
      end
      local ends = now + at
      if algorithm.windowed then
        local window_end = (idiv(now, a) + 1) * a
        if window_end < ends then ends = window_end end
      end
      if units > 0 then algorithm.commit(k1, state, ttl, k2) end
      if op == 'take' then
        -- What the next request (cost 1) would get now, as sluice-core's quota_after_take.
        allowed, remaining, reset, retry, delay = algorithm.decide(k1, k2, limit, a, b, c, 1)
        if allowed then remaining = remaining + 1 end
      end
      if units > 0 and op == 'grant' then
        local record = KEYS[#KEYS]
        local held = redis.call('GET', record)
        local total = units
        if held then total = total + match(held, '^(%d+)') end
        redis.call('SET', record, int(total) .. ':' .. int(now) .. ':' .. int(ends), 'PX', ttl_ms(ends - now))
      end
      return {now, units, ends, allowed and 1 or 0, remaining, reset, retry, delay}
    elseif op == 'giveback' then
      -- Never more than the lease still holds, and nothing once it has ended.
      local record = KEYS[#KEYS]
      local held = redis.call('GET', record)
      if not held then return 0 end
      local units, granted, ends = match(held, '^(%d+):(%d+):(%d+)$')
      units, ends = units + 0, ends + 0
      if now > ends then return 0 end
      local back = cost; if back > units then back = units end
      if back == units then redis.call('DEL', record)
      else redis.call('SET', record, int(units - back) .. ':' .. granted .. ':' .. int(ends), 'KEEPTTL') end
      algorithm.refund(k1, k2, limit, a, b, c, granted + 0, back)
      return back
    elseif op == 'refund' then
      algorithm.refund(k1, k2, limit, a, b, c, at, cost)
    elseif op == 'release' then
      return {now, algorithm.refund(k1, k2, limit, a, b, c, at, cost)}
    elseif op == 'renew' then
      return {now, algorithm.renew(k1, k2, limit, a, b, c, at, cost)}
    end
  end
  return 0
end
local function run(op, KEYS, ARGV, base)
  begin(ARGV[base])
  local answer = run_op(op, KEYS, ARGV, base)
  finish()
  return answer
end
