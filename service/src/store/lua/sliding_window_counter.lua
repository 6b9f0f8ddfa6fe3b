-- Sliding window counter, mirroring sluice-core's sliding_window_counter.rs.
-- k[1]: hash {id, cur, prev}. p: window µs.
algorithms.sliding_window_counter = {
  keys = 1,
  decide = function(k, limit, p, cost)
    local window = p[1]
    local w = idiv(window, 1000)
    local st = redis.call('HMGET', k[1], 'id', 'cur', 'prev')
    local id = idiv(now, window)
    local start = id * window
    local elapsed = idiv(now - start, 1000)
    local cur, prev = 0, 0
    if st[1] then
      local sid = tonumber(st[1])
      if sid == id then cur, prev = tonumber(st[2]), tonumber(st[3])
      elseif sid + 1 == id then prev = tonumber(st[2]) end
    end
    local reset = start + window - now
    local function room(c, pr, e) local r = limit * w - (pr * (w - e) + c * w); if r < 0 then r = 0 end; return r end
    local room_now = room(cur, prev, elapsed)
    if cost * w > room_now or cost > limit then
      local retry = reset
      if cost <= limit then
        local function first_fit(c, pr)
          if limit < c + cost then return nil end
          local spare = (limit - c - cost) * w
          if pr == 0 then return 0 end
          local e = w - idiv(spare, pr); if e < 0 then e = 0 end
          if e < w then return e end
          return nil
        end
        local at
        local e = first_fit(cur, prev)
        if e then at = start + e * 1000 else
          e = first_fit(0, cur)
          if e then at = start + window + e * 1000 else at = start + 2 * window end
        end
        retry = at - now; if retry < 1 then retry = 1 end
      end
      return reply(false, idiv(room_now, w), reset, retry)
    end
    return reply(true, idiv(room_now - cost * w, w), reset, 0), function()
      redis.call('HSET', k[1], 'id', int(id), 'cur', int(cur + cost), 'prev', int(prev))
      redis.call('PEXPIRE', k[1], ttl_ms((id + 2) * window - now))
    end
  end,
  refund = function(k, limit, p, at, cost)
    local st = redis.call('HMGET', k[1], 'id', 'cur', 'prev')
    if st[1] then
      local id, admitted = tonumber(st[1]), idiv(at, p[1])
      local field, value = nil, nil
      if id == admitted then field, value = 'cur', st[2] elseif id == admitted + 1 then field, value = 'prev', st[3] end
      if field then
        local v = tonumber(value) - cost; if v < 0 then v = 0 end
        redis.call('HSET', k[1], field, int(v))
      end
    end
  end,
}
