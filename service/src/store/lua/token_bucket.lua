-- Token bucket, mirroring sluice-core's token_bucket.rs. k[1]: hash {t, l}.
-- p: capacity, unit (scaled units per token), rate (units per µs).
local function tb_time_to_full(full, rate, t) local d = full - t; if d < 0 then d = 0 end; return ceil_div(d, rate) end
algorithms.token_bucket = {
  keys = 1,
  decide = function(k, limit, p, cost)
    local capacity, unit, rate = p[1], p[2], p[3]
    local full = capacity * unit
    local st = redis.call('HMGET', k[1], 't', 'l')
    local tokens = full
    if st[1] then
      local t, last = tonumber(st[1]), tonumber(st[2])
      local elapsed = now - last; if elapsed < 0 then elapsed = 0 end
      if elapsed < tb_time_to_full(full, rate, t) then tokens = t + elapsed * rate end
    end
    if cost > capacity then
      local reset = tb_time_to_full(full, rate, tokens)
      return reply(false, idiv(tokens, unit), reset, reset)
    end
    local need = cost * unit
    if need > tokens then
      return reply(false, idiv(tokens, unit), tb_time_to_full(full, rate, tokens), ceil_div(need - tokens, rate))
    end
    local left = tokens - need
    local to_full = tb_time_to_full(full, rate, left)
    return reply(true, idiv(left, unit), to_full, 0), function()
      redis.call('HSET', k[1], 't', int(left), 'l', int(now))
      redis.call('PEXPIRE', k[1], ttl_ms(to_full))
    end
  end,
  refund = function(k, limit, p, at, cost)
    local capacity, unit = p[1], p[2]
    local t = redis.call('HGET', k[1], 't')
    if t then
      local c = cost; if c > capacity then c = capacity end
      t = tonumber(t) + c * unit; if t > capacity * unit then t = capacity * unit end
      redis.call('HSET', k[1], 't', int(t))
    end
  end,
}
