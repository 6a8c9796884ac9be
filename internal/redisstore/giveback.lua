-- ratelimitd give-back: undoes what take.lua wrote for one hash slot when
-- another slot of the same Take denied it (Store.giveBackGroups in
-- store.go): it takes each bucket from the state the admitted Take left (W)
-- to the state a denied Take leaves (T: the stored state with only the
-- post-paid charges applied, which are never given back). The arithmetic
-- is limiter/bucket.go's (instant.sub, instant.less, State.Full), as in
-- take.lua.
--
-- KEYS[j]   a bucket take.lua wrote.
-- ARGV[1]   now in Unix microseconds, or "" to read the server's TIME.
-- ARGV[2]   the now take.lua used, in Unix microseconds.
-- ARGV[3+6(j-1)..8+6(j-1)]  for KEYS[j]: count and period µs (the rate
--           of the last request on it), W TAT µs, W frac, T TAT µs, T frac (the states the admitted
--           Take left and a denied one leaves, from limiter.DecideAll and
--           DecideDenied on what take.lua read).
--
-- For each key:
--   - missing, or W already passed: the bucket is full, or would have been
--     without the take: nothing to give back;
--   - holding exactly W: write T;
--   - holding something else (other takes chained on ours since): move the
--     TAT back by exactly what the admitted Take added beyond the denied
--     one, W − max(T, its now).
-- A bucket moved back to (or before) now is deleted: full.
-- Returns the number of buckets given back. (clock.lua, state.lua and
-- common.lua, prepended, read the clock and have the helpers.)

local taken = tonumber(ARGV[2])

local given = 0
for j, key in ipairs(KEYS) do
  local a = 2 + 6 * (j - 1)
  local count, rate = tonumber(ARGV[a + 1]), ':' .. ARGV[a + 1] .. ':' .. ARGV[a + 2]
  local wus, wfr = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local tus, tfr = tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6])
  local v = redis.call('GET', key)
  if v and not full(wus, wfr, now) then
    local cus, cfr = parse(key, v)
    if not cus then
      return error(cfr)
    end
    if cus == wus and cfr == wfr then
      store(key, tus, tfr, now, rate)
    else
      -- What the admitted Take added: W − max(T, its now), as in Decide.
      local bus, bfr = tus, math.min(tfr, count - 1)
      if less(bus, bfr, taken, 0) then
        bus, bfr = taken, 0
      end
      if less(bus, bfr, wus, wfr) then
        local dus, dfr = sub(wus, wfr, bus, bfr, count)
        cfr = math.min(cfr, count - 1)
        if less(cus, cfr, dus, dfr) then
          redis.call('DEL', key)
        else
          local nus, nfr = sub(cus, cfr, dus, dfr, count)
          store(key, nus, nfr, now, rate)
        end
      end
    end
    given = given + 1
  end
end
return given
