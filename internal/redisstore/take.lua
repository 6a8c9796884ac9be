-- ratelimitd take: applies Takes to their buckets, each all-or-nothing, one
-- after the other. For each Take (on a cluster: the requests of one Take in
-- one hash slot) it reads the state "TAT:Frac" of every bucket first,
-- decides every request, and writes what limiter.DecideAll says a store
-- writes: the state each bucket is left in, when it differs from the stored
-- one. If every request is admitted (a Shadow one need not be), the takes,
-- reservations and post-paid charges are written; if one is denied, only the
-- post-paid charges. It is limiter.DecideAll and limiter.Decide
-- (limiter/bucket.go) step by step, with the same integer arithmetic: see
-- the "mirrors" comments.
-- Several Takes travel in one call when the Store coalesces them (one script
-- entry, one TIME, one reply for the batch); each is still decided alone, on
-- the state the Takes before it left.
-- Go side: internal/redisstore/store.go (Store.Take, takeArgs, decodeTake)
-- and batch.go (merging). It starts with common.lua (store.go prepends it):
-- divmod, less, sub, ceil_us, full, and now, read from ARGV[1] or the
-- server's TIME.
--
-- Lua numbers are doubles: every value below stays an integer under 2^53
-- for a valid limiter.Limit and Request (limiter.MaxTokens, MaxFill), and so
-- does everything returned (Redis truncates returned numbers to integers).
-- A written TAT is at most now + FillTime + MaxWait (2·MaxFill), which
-- stays below 2^53 µs for any now before 2055 (the slowest limit, 100 years
-- to fill, with the longest MaxWait, 100 years), and before 2155 without
-- reservations. Spans are computed in the frame of now (see decide), where
-- none exceeds 2·MaxFill (plus however far a caller's clock stepped back).
--
-- KEYS      the buckets of every request of every Take, in order; a key may
--           repeat.
-- ARGV      per Take, starting at ARGV[1]:
--   a       now in Unix microseconds, or "" for the server's TIME (every
--           Take of a call uses the same clock; common.lua reads ARGV[1]).
--   a+1     n, the number of its requests (its next n KEYS).
--   a+2     "1" to add, per request, what the request answers when another
--           slot of the same Take denies, and the give-back record (used
--           when one Take spans several slots).
--   a+3+9(i-1)..a+11+9(i-1)  of request i: count, q and r (the period in
--           µs is q·count + r, split in Go: the period itself may exceed
--           2^53), the period in µs rounded to a double (only to estimate,
--           as Go's float64(p) does), burst, hits, max debt, max wait in
--           whole µs (rounded down: a wait rounded up to the µs fits within
--           MaxWait exactly when it fits within this), shadow (0/1).
--
-- Returns one reply per Take, in order: an error reply if one of its
-- buckets is a string other than "TAT:Frac" (nothing of that Take is
-- written; the others are decided as usual), else
--   {now, all admitted (0/1), then for each request:
--   allowed (0/1), exceeds burst (0/1), remaining, retry after µs,
--   reset after µs, wait µs,
--   and with extras = "1":
--   the same six as answered when the Take is denied (in another slot),
--   give back (0/1: on the last request naming a key that this slot
--   admitted, when its state differs from what a denied Take leaves),
--   admitted TAT µs, admitted frac (the state the admitted Take leaves),
--   denied TAT µs, denied frac (the state a denied Take leaves)}.
-- A key of another Redis type (a hash, a list...) is no error: MGET answers
-- nil for it, so it counts as a missing key, a full bucket, and a Take that
-- writes the bucket overwrites it.

-- mirrors Limit.advance: t + n·Period/Count, with Period = q·Count + r so
-- that n·q and n·r stay below 2^53.
local function advance(l, us, fr, n)
  local carry, f = divmod(fr + n * l.r, l.count)
  return us + n * l.q + carry, f
end

-- mirrors Limit.tokensIn: floor(x·Count/Period), a float estimate corrected
-- with exact steps.
local function tokens_in(l, xus, xfr)
  local n = math.floor((xus + xfr / l.count) * l.count / l.period)
  n = math.max(0, math.min(n, l.burst))
  while n < l.burst do
    local aus, afr = advance(l, 0, 0, n + 1)
    if less(xus, xfr, aus, afr) then
      break
    end
    n = n + 1
  end
  while n > 0 do
    local aus, afr = advance(l, 0, 0, n)
    if not less(xus, xfr, aus, afr) then
      break
    end
    n = n - 1
  end
  return n
end

-- mirrors Decide: returns the next state (us, frac) and the decision
-- {allowed, exceeds, remaining, retry µs, reset µs, wait µs}. charge is
-- Request.Charge; maxwait is in whole µs.
-- It works in the frame of now: where Decide computes next = advance(tat,
-- hits) and then used = next − now, this computes used = advance(tat − now,
-- hits) directly, the same integers. It matters for doubles: a bucket with
-- a 100-year fill and a reservation 100 years ahead has tat − now up to
-- 2·MaxFill; adding a burst to it would pass 2^53, so "used > tau" is
-- decided as "tat − now > tau − hits' time", and used is formed only when
-- it is at most tau + MaxWait.
local function decide(l, sus, sfr, now, hits, charge, maxwait)
  local tus, tfr = sus - now, math.min(sfr, l.count - 1) -- before: tat − now
  if less(tus, tfr, 0, 0) then
    tus, tfr = 0, 0
  end
  local fus, ffr = advance(l, 0, 0, l.burst) -- tau, Limit.fillTime
  if charge then
    -- mirrors Limit.charge
    local lus, lfr = advance(l, fus, ffr, l.maxdebt) -- floor
    if less(lus, lfr, tus, tfr) then -- already deeper: a charge never refills
      lus, lfr = tus, tfr
    end
    local h = math.min(hits, l.burst + l.maxdebt)
    local hus, hfr = advance(l, 0, 0, h)
    local mus, mfr = sub(lus, lfr, hus, hfr, l.count) -- floor − h's time
    local uus, ufr = lus, lfr -- used, capped at floor
    if not less(mus, mfr, tus, tfr) then
      uus, ufr = advance(l, tus, tfr, h)
    end
    local d = {0, 0, 0, 0, ceil_us(uus, ufr), 0}
    if less(fus, ffr, tus, tfr) then -- in debt before: denied
      d[4] = ceil_us(sub(tus, tfr, fus, ffr, l.count))
    else
      d[1] = 1
      if not less(fus, ffr, uus, ufr) then
        d[3] = tokens_in(l, sub(fus, ffr, uus, ufr, l.count))
      end
    end
    return now + uus, ufr, d
  end
  if hits > l.burst then
    return sus, sfr, {0, 1, 0, 0, ceil_us(tus, tfr), 0}
  end
  local hus, hfr = advance(l, 0, 0, hits)
  local rus, rfr = sub(fus, ffr, hus, hfr, l.count) -- tau − hits' time
  if not less(rus, rfr, tus, tfr) then -- used ≤ tau: admitted
    local uus, ufr = advance(l, tus, tfr, hits) -- used: time until full again
    local d = {1, 0, tokens_in(l, sub(fus, ffr, uus, ufr, l.count)), 0, ceil_us(uus, ufr), 0}
    if hits == 0 then
      return sus, sfr, d
    end
    return now + uus, ufr, d -- next
  end
  -- until this request's tokens have arrived: used − tau
  local wait = ceil_us(sub(tus, tfr, rus, rfr, l.count))
  if hits > 0 and maxwait > 0 and wait <= maxwait then
    local uus, ufr = advance(l, tus, tfr, hits) -- at most tau + MaxWait
    return now + uus, ufr, {1, 0, 0, 0, ceil_us(uus, ufr), wait}
  end
  return sus, sfr, {0, 0, 0, wait, ceil_us(tus, tfr), 0}
end

-- Every bucket of the call, read at once: key → its value, or false when
-- missing. The Takes update it as they write, so that each sees the state
-- the ones before it left.
local values = {}
for first = 1, #KEYS, 1000 do -- unpack's results must fit Lua's C stack
  local last = math.min(first + 999, #KEYS)
  local got = redis.call('MGET', unpack(KEYS, first, last))
  for i = first, last do
    values[KEYS[i]] = got[i - first + 1]
  end
end

-- The stored state of key: us, frac; a missing key is a full bucket
-- (State{}). Anything else than "TAT:Frac" returns nil and a message.
local function load(key)
  local v = values[key]
  if not v then
    return 0, 0
  end
  local a, b = string.match(v, '^(-?%d+):(%d+)$')
  if not a then
    return nil, 'ratelimitd: bucket ' .. key .. ' holds ' .. v .. ', not TAT:Frac'
  end
  return tonumber(a), tonumber(b)
end

local function same(a, b)
  return a[1] == b[1] and a[2] == b[2]
end

-- request reads the request whose nine arguments follow ARGV[b]: the
-- request and its limit in one table (decide reads the limit's fields,
-- count, q, r, period, burst and maxdebt, from it).
local function request(b)
  local hits, maxdebt = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
  return {
    count = tonumber(ARGV[b + 1]),
    q = tonumber(ARGV[b + 2]),
    r = tonumber(ARGV[b + 3]),
    period = tonumber(ARGV[b + 4]),
    burst = tonumber(ARGV[b + 5]),
    maxdebt = maxdebt,
    hits = hits,
    charge = maxdebt > 0 and hits > 0, -- mirrors Request.Charge
    maxwait = tonumber(ARGV[b + 8]),
    shadow = ARGV[b + 9] == '1',
  }
end

-- write stores state (us, fr) in key, expiring when the bucket is full
-- again (for a bucket in debt, after the debt is paid and it refills);
-- count is that of the last request on the key.
local function write(key, us, fr, now, count)
  local v = string.format('%d:%d', us, fr) -- Lua 5.1: as a C long
  values[key] = v
  if server_clock then
    -- It expires when the server's clock (the one TIME read) passes the
    -- TAT: the key vanishing means exactly "full".
    redis.call('SET', key, v, 'PXAT', (divmod(ceil_us(us, fr) + 999, 1000)))
  else
    redis.call('SET', key, v, 'PX', (divmod(ceil_us(sub(us, fr, now, 0, count)) + 999, 1000)))
  end
end

-- take_single is take (below) for a Take of one request without extras,
-- the common case, without take's per-key tables: DecideAll over one
-- request.
local function take_single(key, b, now)
  local r = request(b)
  local us, fr = load(key)
  if not us then
    return redis.error_reply(fr)
  end
  local nus, nfr, d = decide(r, us, fr, now, r.hits, r.charge, r.maxwait)
  local allowed = 1
  if d[1] == 0 and not r.shadow then
    -- Denied: only a post-paid charge is written (what decide just
    -- computed, as DecideAll's denied path recomputes it); the request
    -- keeps its denial.
    allowed = 0
    if not r.charge then
      nus, nfr = us, fr
    end
  end
  if r.hits > 0 and (nus ~= us or nfr ~= fr) then
    write(key, nus, nfr, now, r.count)
  end
  return {now, allowed, d[1], d[2], d[3], d[4], d[5], d[6]}
end

-- take decides the Take whose n requests are KEYS[k+1..k+n] and whose
-- arguments start at ARGV[a], at now, writes what it says, and returns its
-- reply.
local function take(k, a, n, now)
  local extras = ARGV[a + 2] == '1'
  if n == 1 and not extras then
    return take_single(KEYS[k + 1], a + 2, now)
  end
  local keys = {}
  local reqs = {}
  local stored = {} -- key → {us, frac}
  for i = 1, n do
    reqs[i] = request(a + 2 + 9 * (i - 1))
    local key = KEYS[k + i]
    keys[i] = key
    if not stored[key] then
      local us, fr = load(key)
      if not us then
        return redis.error_reply(fr)
      end
      stored[key] = {us, fr}
    end
  end

  -- mirrors DecideAll: each request sees the state left by the requests
  -- before it that name the same key.
  local cur = {}     -- key → {us, frac}: the state as the requests so far leave it
  local touched = {} -- key → true when a request on it has hits > 0
  local last = {}    -- key → the index of the last request naming it
  local decisions = {}
  local allowed = 1
  for i = 1, n do
    local key, r = keys[i], reqs[i]
    local s = cur[key] or stored[key]
    local nus, nfr, d = decide(r, s[1], s[2], now, r.hits, r.charge, r.maxwait)
    cur[key] = {nus, nfr}
    decisions[i] = d
    if d[1] == 0 and not r.shadow then
      allowed = 0
    end
    if r.hits > 0 then
      touched[key] = true
    end
    last[key] = i
  end

  -- mirrors the end of DecideAll, for a denied Take: only post-paid
  -- charges are applied, chained per key; the requests that were admitted
  -- report their bucket as a check (hits 0) would; the others keep their
  -- denial.
  local curDenied, decisionsDenied
  if allowed == 0 or extras then
    curDenied, decisionsDenied = {}, {}
    for i = 1, n do
      local key, r = keys[i], reqs[i]
      local s = curDenied[key] or stored[key]
      if r.charge then
        local nus, nfr, d = decide(r, s[1], s[2], now, r.hits, true, r.maxwait)
        curDenied[key] = {nus, nfr}
        decisionsDenied[i] = d
      elseif decisions[i][1] == 1 then
        local _, _, d = decide(r, s[1], s[2], now, 0, false, 0)
        curDenied[key] = s
        decisionsDenied[i] = d
      else
        curDenied[key] = s
        decisionsDenied[i] = decisions[i]
      end
    end
  end
  local final = cur
  if allowed == 0 then
    final, decisions = curDenied, decisionsDenied
  end

  -- The write rule of DecideAll: a bucket that a request with hits > 0 left
  -- in another state than the stored one.
  for key in pairs(touched) do
    local s = final[key]
    if not same(s, stored[key]) then
      write(key, s[1], s[2], now, reqs[last[key]].count)
    end
  end

  local out = {now, allowed}
  local o = 2
  for i = 1, n do
    local d = decisions[i]
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = d[1], d[2], d[3], d[4], d[5], d[6]
    o = o + 6
    if extras then
      local e = decisionsDenied[i]
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = e[1], e[2], e[3], e[4], e[5], e[6]
      local key = keys[i]
      local w, t = cur[key], curDenied[key]
      if allowed == 1 and last[key] == i and not same(w, t) then
        out[o + 7] = 1
      else
        out[o + 7] = 0
      end
      out[o + 8], out[o + 9], out[o + 10], out[o + 11] = w[1], w[2], t[1], t[2]
      o = o + 11
    end
  end
  return out
end

-- The Takes, one after the other. common.lua set now from ARGV[1]: the
-- server's TIME, read once for the call, or the first Take's own now.
local replies = {}
local k, a = 0, 1
while a <= #ARGV do
  local n = tonumber(ARGV[a + 1])
  local tnow = now
  if not server_clock then
    tnow = tonumber(ARGV[a])
  end
  replies[#replies + 1] = take(k, a, n, tnow)
  k, a = k + n, a + 3 + 9 * n
end
return replies
