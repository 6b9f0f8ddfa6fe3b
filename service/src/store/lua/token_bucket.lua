-- Token bucket, mirroring sluice-core's token_bucket.rs. KEYS[1]: hash {t, l}.
-- ARGV[5] capacity, ARGV[6] unit (scaled units per token), ARGV[7] rate (units per µs).
local capacity, unit, rate = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local full = capacity * unit
local function time_to_full(t) local d = full - t; if d < 0 then d = 0 end; return ceil_div(d, rate) end
local st = redis.call('HMGET', KEYS[1], 't', 'l')
if op == 'refund' then
  if st[1] then
    local c = cost; if c > capacity then c = capacity end
    local t = tonumber(st[1]) + c * unit; if t > full then t = full end
    redis.call('HSET', KEYS[1], 't', int(t))
  end
  return 0
end
local tokens = full
if st[1] then
  local t, last = tonumber(st[1]), tonumber(st[2])
  local elapsed = now - last; if elapsed < 0 then elapsed = 0 end
  if elapsed < time_to_full(t) then tokens = t + elapsed * rate end
end
if cost > capacity then
  local reset = time_to_full(tokens)
  return reply(false, idiv(tokens, unit), reset, reset)
end
local need = cost * unit
if need > tokens then
  return reply(false, idiv(tokens, unit), time_to_full(tokens), ceil_div(need - tokens, rate))
end
local left = tokens - need
redis.call('HSET', KEYS[1], 't', int(left), 'l', int(now))
redis.call('PEXPIRE', KEYS[1], ttl_ms(time_to_full(left)))
return reply(true, idiv(left, unit), time_to_full(left), 0)
