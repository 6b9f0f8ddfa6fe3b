-- Concurrency, mirroring sluice-core's concurrency.rs: the sliding log's decision over the
-- slots held, kept as one string (one GET, one SET a call, as the other one-key states):
-- k1 "<held>|<at>:<cost>,..." oldest first, `at` when a slot was taken or last renewed (two
-- slots taken in one µs may be two entries: core merges them; every decision is the same).
-- a: window µs, how long a slot outlives `at`. A refusal's retry and every decision's reset
-- are a second, or the window when shorter. 'release' gives slots back (a refund at their
-- time), 'renew' moves them to now; both answer the slots they found.
algorithms.concurrency = function()
  local gmatch, sub, concat = string.gmatch, string.sub, table.concat
  -- Scratch arrays a library keeps between calls: only their first n entries are the state
  -- being read.
  local ats, costs, parts = {}, {}, {}
  -- Reads `stored` into ats/costs (with `window`, only the slots still alive at now): their
  -- number and total cost. ("<held>|" is followed by no ':', so it matches no entry.)
  local function read(stored, window)
    local n, used = 0, 0
    if stored then
      for at, c in gmatch(stored, '(%d+):(%d+)') do
        at = at + 0
        if not window or at + window > now then
          n = n + 1; ats[n], costs[n] = at, c + 0; used = used + costs[n]
        end
      end
    end
    return n, used
  end
  local function text(n)
    local used = 0
    for i = 1, n do parts[i] = int(ats[i]) .. ':' .. int(costs[i]); used = used + costs[i] end
    return int(used) .. '|' .. concat(parts, ',', 1, n)
  end
  local function short(window) if window < 1000000 then return window end return 1000000 end
  -- Takes up to `cost` at `at`, newest entries first; the number of entries left and what was taken.
  local function take(n, at, cost)
    local taken, i = 0, n
    while i >= 1 and taken < cost do
      if ats[i] == at then
        local t = costs[i]; if t > cost - taken then t = cost - taken end
        costs[i], taken = costs[i] - t, taken + t
        if costs[i] == 0 then
          for j = i, n - 1 do ats[j], costs[j] = ats[j + 1], costs[j + 1] end
          n = n - 1
        end
      end
      i = i - 1
    end
    return n, taken
  end
  -- Adds `cost` at `at`, keeping time order; the number of entries.
  local function add(n, at, cost)
    local i = n
    while i > 0 and ats[i] > at do i = i - 1 end
    if i > 0 and ats[i] == at then costs[i] = costs[i] + cost; return n end
    for j = n, i + 1, -1 do ats[j + 1], costs[j + 1] = ats[j], costs[j] end
    ats[i + 1], costs[i + 1] = at, cost
    return n + 1
  end
  local function release(k1, _, _, _, _, _, at, cost)
    local n = read(load(k1))
    local left, taken = take(n, at, cost)
    if taken > 0 then store(k1, text(left)) end
    return taken
  end
  return {
    keys = 1,
    decide = function(k1, _, limit, window, _, _, cost)
      local stored = load(k1)
      local advice = short(window)
      if not stored then
        if cost > limit then return false, limit, advice, advice, 0 end
        return true, limit - cost, advice, 0, 0, format('%d|%d:%d', cost, now, cost), window
      end
      -- The slots are oldest first: those that expired are a prefix, walked only when the
      -- oldest has; the live rest is kept as text, and an admission appends one entry (one
      -- match and one format when nothing expired, as a token bucket's).
      local h, oldest = match(stored, '^(%d+)|(%d*)')
      local held, live = h + 0, #h + 2
      if oldest ~= '' and oldest + window <= now then
        repeat
          local at, c, after = match(stored, '^(%d+):(%d+),?()', live)
          if not at or at + window > now then break end
          held, live = held - c, after
        until false
      end
      local free = limit - held; if free < 0 then free = 0 end
      if cost > free then return false, free, advice, advice, 0 end
      if live > #stored then
        return true, free - cost, advice, 0, 0, format('%d|%d:%d', held + cost, now, cost), window
      end
      return true, free - cost, advice, 0, 0, format('%d|%s,%d:%d', held + cost, sub(stored, live), now, cost), window
    end,
    commit = store,
    refund = release,
    renew = function(k1, _, _, window, _, _, at, cost)
      local n = read(load(k1))
      local left, moved = take(n, at, cost)
      if moved > 0 then store(k1, text(add(left, now, moved)), window) end
      return moved
    end,
  }
end
