-- Sliding window counter, mirroring sluice-core's sliding_window_counter.rs.
-- k1: "<id>:<current>:<previous>". a: window µs.
algorithms.sliding_window_counter = function()
  return {
    keys = 1,
    windowed = true,
    decide = function(k1, _, limit, window, _, _, cost)
      local w = (window - window % 1000) / 1000
      local stored = load(k1)
      local start = now - now % window
      local id = start / window
      local elapsed = (now - start - (now - start) % 1000) / 1000
      local cur, prev = 0, 0
      if stored then
        local sid, c, p = match(stored, '^(%d+):(%d+):(%d+)$')
        sid = sid + 0
        if sid == id then cur, prev = c + 0, p + 0
        elseif sid + 1 == id then prev = c + 0 end
      end
      local reset = start + window - now
      local room_now = limit * w - (prev * (w - elapsed) + cur * w); if room_now < 0 then room_now = 0 end
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
        return false, idiv(room_now, w), reset, retry, 0
      end
      -- A key already counting this window expires with the next (its first admission said so).
      local room = room_now - cost * w
      return true, (room - room % w) / w, reset, 0, 0,
        format('%d:%d:%d', id, cur + cost, prev), cur == 0 and (id + 2) * window - now or nil
    end,
    commit = store,
    refund = function(k1, _, limit, window, _, _, at, cost)
      local stored = load(k1)
      if not stored then return end
      local id, cur, prev = match(stored, '^(%d+):(%d+):(%d+)$')
      local admitted = idiv(at, window)
      local function less(v) v = v - cost; if v < 0 then v = 0 end; return int(v) end
      if id + 0 == admitted then cur = less(cur) elseif id + 0 == admitted + 1 then prev = less(prev) else return end
      store(k1, id .. ':' .. cur .. ':' .. prev)
    end,
  }
end
