-- Fixed window, mirroring sluice-core's fixed_window.rs. k1: "<id>:<count>". a: window µs.
algorithms.fixed_window = function()
  return {
    keys = 1,
    windowed = true,
    decide = function(k1, _, limit, window, _, _, cost)
      local stored = load(k1)
      local id = idiv(now, window)
      local count = 0
      if stored then
        local sid, c = match(stored, '^(%d+):(%d+)$')
        if sid + 0 == id then count = c + 0 end
      end
      local reset = (id + 1) * window - now
      local used = count; if used > limit then used = limit end
      if cost > limit - used then return false, limit - used, reset, reset, 0 end
      -- A key already counting this window expires with it (its first admission said so).
      return true, limit - count - cost, reset, 0, 0, format('%d:%d', id, count + cost), count == 0 and reset or nil
    end,
    commit = store,
    refund = function(k1, _, limit, window, _, _, at, cost)
      local stored = load(k1)
      if not stored then return end
      local id, count = match(stored, '^(%d+):(%d+)$')
      if id + 0 == idiv(at, window) then
        local c = count - cost; if c < 0 then c = 0 end
        store(k1, id .. ':' .. int(c))
      end
    end,
  }
end
