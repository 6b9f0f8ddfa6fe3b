-- Token bucket, mirroring sluice-core's token_bucket.rs. k1: "<tokens>:<last>".
-- a: capacity, b: unit (scaled units per token), c: rate (units per µs).
algorithms.token_bucket = function()
  -- ⌈(full - t) / rate⌉, at least 0.
  local function time_to_full(full, rate, t)
    local d = full - t; if d <= 0 then return 0 end
    d = d + rate - 1
    return (d - d % rate) / rate
  end
  return {
    keys = 1,
    decide = function(k1, _, limit, capacity, unit, rate, cost)
      local full = capacity * unit
      local stored = load(k1)
      local tokens = full
      if stored then
        local t, last = match(stored, '^(%d+):(%d+)$')
        t, last = t + 0, last + 0
        local elapsed = now - last; if elapsed < 0 then elapsed = 0 end
        if elapsed < time_to_full(full, rate, t) then tokens = t + elapsed * rate end
      end
      if cost > capacity then
        local reset = time_to_full(full, rate, tokens)
        return false, idiv(tokens, unit), reset, reset, 0
      end
      local need = cost * unit
      if need > tokens then
        return false, idiv(tokens, unit), time_to_full(full, rate, tokens), ceil_div(need - tokens, rate), 0
      end
      local left = tokens - need
      local to_full = time_to_full(full, rate, left)
      return true, (left - left % unit) / unit, to_full, 0, 0, format('%d:%d', left, now), to_full
    end,
    commit = store,
    refund = function(k1, _, limit, capacity, unit, rate, at, cost)
      local stored = load(k1)
      if stored then
        local t, last = match(stored, '^(%d+):(%d+)$')
        local c = cost; if c > capacity then c = capacity end
        t = t + c * unit; if t > capacity * unit then t = capacity * unit end
        store(k1, int(t) .. ':' .. last)
      end
    end,
  }
end
