-- Sliding window counter, mirroring sluice-core's sliding_window_counter.rs.
-- KEYS[1]: hash {id, cur, prev}. ARGV[5] window µs.
local window = tonumber(ARGV[5])
local w = idiv(window, 1000)
local st = redis.call('HMGET', KEYS[1], 'id', 'cur', 'prev')
if op == 'refund' then
  if st[1] then
    local id, admitted = tonumber(st[1]), idiv(tonumber(ARGV[8]), window)
    local field = nil
    if id == admitted then field = 'cur' elseif id == admitted + 1 then field = 'prev' end
    if field then
      local v = tonumber(redis.call('HGET', KEYS[1], field)) - cost; if v < 0 then v = 0 end
      redis.call('HSET', KEYS[1], field, int(v))
    end
  end
  return 0
end
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
local function room(c, p, e) local r = limit * w - (p * (w - e) + c * w); if r < 0 then r = 0 end; return r end
local room_now = room(cur, prev, elapsed)
if cost * w > room_now or cost > limit then
  local retry = reset
  if cost <= limit then
    local function first_fit(c, p)
      if limit < c + cost then return nil end
      local spare = (limit - c - cost) * w
      if p == 0 then return 0 end
      local e = w - idiv(spare, p); if e < 0 then e = 0 end
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
redis.call('HSET', KEYS[1], 'id', int(id), 'cur', int(cur + cost), 'prev', int(prev))
redis.call('PEXPIRE', KEYS[1], ttl_ms((id + 2) * window - now))
return reply(true, idiv(room_now - cost * w, w), reset, 0)
