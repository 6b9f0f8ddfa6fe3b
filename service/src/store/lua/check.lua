-- The driver: decides one request against every rule it names, all-or-nothing, mirroring
-- sluice-core's `decide_all`. The request passes when every enforced rule admits it; only
-- then does each rule that admitted it (shadow rules too) keep its new state.
-- ARGV[1] 'decide' | 'refund'; ARGV[2] clock (see common); ARGV[3] cost; ARGV[4] for a
-- refund the time the admissions were made at; then six values per rule: algorithm,
-- shadow (1/0), limit and its three derived numbers. KEYS: each rule's state keys in turn.
-- 'decide' returns {now, then allowed, remaining, reset, retry, delay per rule}.
local op, cost, at = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
local rules, next_key = {}, 1
for i = 5, #ARGV, 6 do
  local algorithm = algorithms[ARGV[i]]
  if not algorithm then return redis.error_reply('unknown algorithm ' .. ARGV[i]) end
  local k = {}
  for j = 1, algorithm.keys do k[j] = KEYS[next_key]; next_key = next_key + 1 end
  rules[#rules + 1] = {
    algorithm = algorithm, k = k, shadow = ARGV[i + 1] == '1', limit = tonumber(ARGV[i + 2]),
    p = {tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5])},
  }
end
if op == 'refund' then
  for _, r in ipairs(rules) do r.algorithm.refund(r.k, r.limit, r.p, at, cost) end
  return 0
end
local out, commits, passes = {now}, {}, true
for _, r in ipairs(rules) do
  local decision, commit = r.algorithm.decide(r.k, r.limit, r.p, cost)
  if decision[1] == 0 and not r.shadow then passes = false end
  if commit then commits[#commits + 1] = commit end
  for _, v in ipairs(decision) do out[#out + 1] = v end
end
if passes then
  for _, commit in ipairs(commits) do commit() end
end
return out
