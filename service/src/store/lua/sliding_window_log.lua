-- Sliding window log, mirroring sluice-core's sliding_window_log.rs.
-- KEYS[1]: sorted set of admissions (score = time µs, member = "time:seq:cost");
-- KEYS[2]: hash {used, seq}. ARGV[5] window µs.
local window = tonumber(ARGV[5])
local function cost_of(member) return tonumber(string.match(member, ':(%d+)$')) end
if op == 'refund' then
  local at = tonumber(ARGV[8])
  local left = cost
  local members = redis.call('ZRANGEBYSCORE', KEYS[1], int(at), int(at))
  for i = #members, 1, -1 do
    if left <= 0 then break end
    local c = cost_of(members[i])
    local take = c; if take > left then take = left end
    redis.call('ZREM', KEYS[1], members[i])
    if c > take then
      local seq = redis.call('HINCRBY', KEYS[2], 'seq', 1)
      redis.call('ZADD', KEYS[1], int(at), int(at) .. ':' .. seq .. ':' .. int(c - take))
    end
    redis.call('HINCRBY', KEYS[2], 'used', -take)
    left = left - take
  end
  return 0
end
local used = tonumber(redis.call('HGET', KEYS[2], 'used') or '0')
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now - window))
if #expired > 0 then
  for _, m in ipairs(expired) do used = used - cost_of(m) end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now - window))
  redis.call('HSET', KEYS[2], 'used', int(used))
end
local free = limit - used; if free < 0 then free = 0 end
if cost > free then
  local reset = 0
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then reset = tonumber(last[2]) + window - now; if reset < 0 then reset = 0 end end
  local retry = reset
  if cost <= limit then
    local missing = cost - free
    local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
    for i = 1, #entries, 2 do
      local c = cost_of(entries[i])
      if c >= missing then
        retry = tonumber(entries[i + 1]) + window - now; if retry < 0 then retry = 0 end
        break
      end
      missing = missing - c
    end
  end
  return reply(false, free, reset, retry)
end
local seq = redis.call('HINCRBY', KEYS[2], 'seq', 1)
redis.call('ZADD', KEYS[1], int(now), int(now) .. ':' .. seq .. ':' .. int(cost))
redis.call('HSET', KEYS[2], 'used', int(used + cost))
redis.call('PEXPIRE', KEYS[1], ttl_ms(window))
redis.call('PEXPIRE', KEYS[2], ttl_ms(window))
return reply(true, free - cost, window, 0)
