-- Concurrency, mirroring sluice-core's concurrency.rs: a sliding window log whose window is
-- how long a slot outlives its last renewal. A refusal's retry and every decision's reset
-- are a second, or the window when shorter. 'release' gives slots back (a refund at their
-- time), 'renew' moves them to now; both answer the slots they found.
algorithms.concurrency = function()
  local log = algorithms.sliding_window_log()
  local function short(window) if window < 1000000 then return window end return 1000000 end
  return {
    keys = 2,
    decide = function(k1, k2, limit, window, b, c, cost)
      local allowed, remaining, reset, retry, delay, state, ttl = log.decide(k1, k2, limit, window, b, c, cost)
      reset = short(window)
      if not allowed then retry = reset end
      return allowed, remaining, reset, retry, delay, state, ttl
    end,
    commit = log.commit,
    refund = log.refund,
    renew = function(k1, k2, limit, window, b, c, at, cost)
      local moved = log.refund(k1, k2, limit, window, b, c, at, cost)
      if moved > 0 then
        local seq = redis.call('HINCRBY', k2, 'seq', 1)
        redis.call('ZADD', k1, int(now), int(now) .. ':' .. seq .. ':' .. int(moved))
        redis.call('HINCRBY', k2, 'used', moved)
        redis.call('PEXPIRE', k1, ttl_ms(window))
        redis.call('PEXPIRE', k2, ttl_ms(window))
      end
      return moved
    end,
  }
end
