-- GCRA and leaky bucket (with shaping), mirroring sluice-core's gcra.rs. KEYS[1]: the TAT.
-- ARGV[5] capacity, ARGV[6] interval µs, ARGV[7] max_delay µs (0 unless shaping).
local capacity, interval, max_delay = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local stored = redis.call('GET', KEYS[1])
if op == 'refund' then
  if stored then
    local at = tonumber(ARGV[8])
    local tat = tonumber(stored) - cost * interval
    if tat < 0 then tat = 0 end
    if tat < at then tat = at end
    redis.call('SET', KEYS[1], int(tat), 'KEEPTTL')
  end
  return 0
end
local tat = now
if stored then tat = tonumber(stored); if tat < now then tat = now end end
local tau = capacity * interval
local waited = tat - now; if waited > tau then waited = tau end
local remaining_before = idiv(tau - waited, interval)
if cost > capacity then return reply(false, remaining_before, tat - now, tat - now) end
local new_tat = tat + cost * interval
local over = new_tat - now - tau; if over < 0 then over = 0 end
if over > max_delay then return reply(false, remaining_before, tat - now, over - max_delay) end
redis.call('SET', KEYS[1], int(new_tat), 'PX', ttl_ms(new_tat - now))
local left = tau - (new_tat - now); if left < 0 then left = 0 end
return reply(true, idiv(left, interval), new_tat - now, 0, over)
