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
-- ARGV[2+5(i-1)..6+5(i-1)]  of request i: count, q and r (the period in µs
--           is q·count + r: limiter.Limit's), burst + max debt, hits.
--
-- Returns the number of buckets written or deleted. (common.lua, prepended,
-- has the helpers and reads the clock.)

local changed = 0
for i, key in ipairs(KEYS) do
  local a = 1 + 5 * (i - 1)
  local count, q, r = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local most, hits = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local v = redis.call('GET', key)
  if v then
    local sus, sfr = parse(key, v)
    if not sus then
      return error(sfr)
    end
    local tus, tfr = sus, math.min(sfr, count - 1)
    -- mirrors Refund
    local nus, nfr = sus, sfr -- the next state
    if less(now, 0, tus, tfr) then
      -- back = advance(0, min(hits, burst + max debt)), as Limit.advance
      local n = math.min(hits, most)
      local carry, bfr = divmod(n * r, count)
      local bus = n * q + carry
      local dus, dfr = sub(tus, tfr, now, 0, count) -- time until full
      if less(bus, bfr, dus, dfr) then
        nus, nfr = sub(tus, tfr, bus, bfr, count)
      else
        nus, nfr = now, 0
      end
    end
    if full(nus, nfr, now) then
      redis.call('DEL', key)
      changed = changed + 1
    elseif nus ~= sus or nfr ~= sfr then
      put(key, nus, nfr, now)
      changed = changed + 1
    end
  end
end
return changed
