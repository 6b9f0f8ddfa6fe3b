-- Fixed window, mirroring sluice-core's fixed_window.rs. k[1]: hash {id, c}. p: window µs.
algorithms.fixed_window = {
  keys = 1,
  decide = function(k, limit, p, cost)
    local window = p[1]
    local st = redis.call('HMGET', k[1], 'id', 'c')
    local id = idiv(now, window)
    local count = 0
    if st[1] and tonumber(st[1]) == id then count = tonumber(st[2]) end
    local reset = (id + 1) * window - now
    local used = count; if used > limit then used = limit end
    if cost > limit - used then return reply(false, limit - used, reset, reset) end
    return reply(true, limit - count - cost, reset, 0), function()
      redis.call('HSET', k[1], 'id', int(id), 'c', int(count + cost))
      redis.call('PEXPIRE', k[1], ttl_ms(reset))
    end
  end,
  refund = function(k, limit, p, at, cost)
    local st = redis.call('HMGET', k[1], 'id', 'c')
    if st[1] and tonumber(st[1]) == idiv(at, p[1]) then
      local c = tonumber(st[2]) - cost; if c < 0 then c = 0 end
      redis.call('HSET', k[1], 'c', int(c))
    end
  end,
}
