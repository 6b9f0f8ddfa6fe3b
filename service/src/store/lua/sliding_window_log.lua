-- Sliding window log, mirroring sluice-core's sliding_window_log.rs.
-- k1: sorted set of admissions (score = time µs, member = "time:seq:cost");
-- k2: hash {used, seq}. a: window µs.
algorithms.sliding_window_log = function()
  local function cost_of(member) return match(member, ':(%d+)$') + 0 end
  return {
    keys = 2,
    decide = function(k1, k2, limit, window, _, _, cost)
      local used = (redis.call('HGET', k2, 'used') or 0) + 0
      -- Dropping what left the window changes no decision, so it is done even on a denial.
      local expired = redis.call('ZRANGEBYSCORE', k1, '-inf', int(now - window))
      if #expired > 0 then
        for _, m in ipairs(expired) do used = used - cost_of(m) end
        redis.call('ZREMRANGEBYSCORE', k1, '-inf', int(now - window))
        redis.call('HSET', k2, 'used', int(used))
      end
      local free = limit - used; if free < 0 then free = 0 end
      if cost > free then
        local reset = 0
        local last = redis.call('ZRANGE', k1, -1, -1, 'WITHSCORES')
        if last[2] then reset = last[2] + window - now; if reset < 0 then reset = 0 end end
        local retry = reset
        if cost <= limit then
          local missing = cost - free
          local entries = redis.call('ZRANGE', k1, 0, -1, 'WITHSCORES')
          for i = 1, #entries, 2 do
            local c = cost_of(entries[i])
            if c >= missing then
              retry = entries[i + 1] + window - now; if retry < 0 then retry = 0 end
              break
            end
            missing = missing - c
          end
        end
        return false, free, reset, retry, 0
      end
      -- Its writes are several commands, so its "state" is the function that sends them.
      return true, free - cost, window, 0, 0, function()
        local seq = redis.call('HINCRBY', k2, 'seq', 1)
        redis.call('ZADD', k1, int(now), int(now) .. ':' .. seq .. ':' .. int(cost))
        redis.call('HSET', k2, 'used', int(used + cost))
        redis.call('PEXPIRE', k1, ttl_ms(window))
        redis.call('PEXPIRE', k2, ttl_ms(window))
      end
    end,
    commit = function(_, write) write() end,
    refund = function(k1, k2, limit, window, _, _, at, cost)
      local left = cost
      local members = redis.call('ZRANGEBYSCORE', k1, int(at), int(at))
      for i = #members, 1, -1 do
        if left <= 0 then break end
        local c = cost_of(members[i])
        local take = c; if take > left then take = left end
        redis.call('ZREM', k1, members[i])
        if c > take then
          local seq = redis.call('HINCRBY', k2, 'seq', 1)
          redis.call('ZADD', k1, int(at), int(at) .. ':' .. seq .. ':' .. int(c - take))
        end
        redis.call('HINCRBY', k2, 'used', -take)
        left = left - take
      end
    end,
  }
end
