-- GCRA and leaky bucket (with shaping), mirroring sluice-core's gcra.rs. k1: the TAT.
-- a: capacity, b: interval µs, c: max_delay µs (0 unless shaping).
algorithms.gcra = function()
  return {
    keys = 1,
    decide = function(k1, _, limit, capacity, interval, max_delay, cost)
      local tat = now
      local stored = load(k1)
      if stored then tat = stored + 0; if tat < now then tat = now end end
      local tau = capacity * interval
      local waited = tat - now; if waited > tau then waited = tau end
      local spare = tau - waited
      local remaining_before = (spare - spare % interval) / interval
      if cost > capacity then return false, remaining_before, tat - now, tat - now, 0 end
      local new_tat = tat + cost * interval
      local over = new_tat - now - tau; if over < 0 then over = 0 end
      if over > max_delay then return false, remaining_before, tat - now, over - max_delay, 0 end
      local left = tau - (new_tat - now); if left < 0 then left = 0 end
      return true, (left - left % interval) / interval, new_tat - now, 0, over, int(new_tat), new_tat - now
    end,
    commit = store,
    refund = function(k1, _, limit, capacity, interval, max_delay, at, cost)
      local stored = load(k1)
      if stored then
        local tat = stored - cost * interval
        if tat < 0 then tat = 0 end
        if tat < at then tat = at end
        store(k1, int(tat))
      end
    end,
  }
end
