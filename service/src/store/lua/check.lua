-- The driver: decides one request against every rule it names, all-or-nothing, mirroring
-- sluice-core's `decide_all`. The request passes when every enforced rule admits it; only
-- then does each rule that admitted it (shadow rules too) keep its new state.
-- ARGV[1] 'decide' | 'refund'; ARGV[2] clock (see common); ARGV[3] for a refund the time
-- the admissions were made at; then seven values per rule: algorithm, shadow (1/0), the
-- request's cost to it, limit and its three derived numbers. KEYS: each rule's state keys
-- in turn.
-- 'decide' returns {now, then allowed, remaining, reset, retry, delay per rule}.
local op, at = ARGV[1], tonumber(ARGV[3])
local built, out, commits, passes, next_key = {}, {now}, {}, true, 1
for i = 4, #ARGV, 7 do
  local name = ARGV[i]
  local algorithm = built[name]
  if not algorithm then
    if not algorithms[name] then return redis.error_reply('unknown algorithm ' .. name) end
    algorithm = algorithms[name]()
    built[name] = algorithm
  end
  local k1, k2 = KEYS[next_key], KEYS[next_key + 1]
  next_key = next_key + algorithm.keys
  local cost = tonumber(ARGV[i + 2])
  local limit, a, b, c = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6])
  if op == 'refund' then
    algorithm.refund(k1, k2, limit, a, b, c, at, cost)
  else
    local allowed, remaining, reset, retry, delay, commit = algorithm.decide(k1, k2, limit, a, b, c, cost)
    if not allowed and ARGV[i + 1] ~= '1' then passes = false end
    if commit then commits[#commits + 1] = commit end
    local n = #out
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = allowed and 1 or 0, remaining, reset, retry, delay
  end
end
if op == 'refund' then return 0 end
if passes then
  for j = 1, #commits do commits[j]() end
end
return out
