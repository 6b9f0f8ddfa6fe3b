-- Fixed window, mirroring sluice-core's fixed_window.rs. KEYS[1]: hash {id, c}.
-- ARGV[5] window µs.
local window = tonumber(ARGV[5])
local st = redis.call('HMGET', KEYS[1], 'id', 'c')
if op == 'refund' then
  local at = tonumber(ARGV[8])
  if st[1] and tonumber(st[1]) == idiv(at, window) then
    local c = tonumber(st[2]) - cost; if c < 0 then c = 0 end
    redis.call('HSET', KEYS[1], 'c', int(c))
  end
  return 0
end
local id = idiv(now, window)
local count = 0
if st[1] and tonumber(st[1]) == id then count = tonumber(st[2]) end
local reset = (id + 1) * window - now
local used = count; if used > limit then used = limit end
if cost > limit - used then return reply(false, limit - used, reset, reset) end
redis.call('HSET', KEYS[1], 'id', int(id), 'c', int(count + cost))
redis.call('PEXPIRE', KEYS[1], ttl_ms(reset))
return reply(true, limit - count - cost, reset, 0)
