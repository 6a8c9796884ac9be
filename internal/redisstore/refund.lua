-- ratelimitd refund: gives tokens back to buckets (Store.Refund in
-- store.go), one request after the other. It is limiter.Refund
-- (limiter/bucket.go) step by step, with the helpers of common.lua: a
-- bucket's TAT moves back by the time its hits take to arrive, but never
-- before now (a bucket cannot be fuller than full). A missing key is a full
-- bucket and stays missing; a bucket left full is deleted, as MemoryStore
-- does; any other is written with the time until full as its TTL.
--
-- KEYS[i]   the bucket of request i; a key may repeat.
-- ARGV[1]   now in Unix microseconds, or "" to read the server's TIME.
-- ARGV[2+5(i-1)..6+5(i-1)]  of request i: count and period µs (the
--           limit's rate; count is the denominator of fractions), cap
--           (burst + max debt, for rescale), then back µs and back frac,
--           the time its tokens take to arrive: limiter.Limit.Span of its
--           hits, at most burst + max debt (the Go side computes it).
--
-- Returns the number of buckets written or deleted. (clock.lua,
-- state.lua and common.lua, prepended, read the clock and have the
-- helpers.)

local changed = 0
for i, key in ipairs(KEYS) do
  local a = 1 + 5 * (i - 1)
  local count, per, cap = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local bus, bfr = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local v = redis.call('GET', key)
  if v then
    local sus, sfr, r0 = parse(key, v)
    if not sus then
      return error(sfr)
    end
    -- mirrors Refund: rescaled first (State.under), then moved back; the
    -- state is written when it differs from the stored one, in its rate
    -- too (a state moved back is under the request's)
    local rate = ':' .. ARGV[a + 1] .. ':' .. ARGV[a + 2]
    local rus, rfr, applied = rescale(sus, sfr, r0, count, per, rate, cap, now)
    local tus, tfr = rus, math.min(rfr, count - 1)
    local nus, nfr, nrate = rus, rfr, r0 -- the next state
    if applied then
      nrate = rate
    end
    if less(now, 0, tus, tfr) then
      local dus, dfr = sub(tus, tfr, now, 0, count) -- time until full
      if less(bus, bfr, dus, dfr) then
        nus, nfr = sub(tus, tfr, bus, bfr, count)
      else
        nus, nfr = now, 0
      end
      nrate = rate
    end
    if full(nus, nfr, now) or nus ~= sus or nfr ~= sfr or nrate ~= r0 then
      store(key, nus, nfr, now, nrate)
      changed = changed + 1
    end
  end
end
return changed
