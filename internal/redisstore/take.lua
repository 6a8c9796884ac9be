-- ratelimitd take: applies the requests of one Take (or, on a cluster, the
-- requests of one hash slot) to their buckets all-or-nothing. It reads the
-- state "TAT:Frac" of every bucket first, decides every request, and writes
-- what limiter.DecideAll says a store writes: the state each bucket is left
-- in, when it differs from the stored one. If every request is admitted (a
-- Shadow one need not be), the takes, reservations and post-paid charges are
-- written; if one is denied, only the post-paid charges. It is
-- limiter.DecideAll and limiter.Decide (limiter/bucket.go) step by step, with
-- the same integer arithmetic: see the "mirrors" comments.
-- Go side: internal/redisstore/store.go (Store.Take, decodeTake). It starts
-- with common.lua (store.go prepends it): divmod, less, sub, ceil_us, full,
-- and now, read from ARGV[1] or the server's TIME.
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
-- KEYS[i]   the bucket of request i; a key may repeat.
-- ARGV[1]   now in Unix microseconds, or "" to read the server's TIME.
-- ARGV[2]   "1" to add, per request, what the request answers when another
--           slot of the same Take denies, and the give-back record (used
--           when one Take spans several slots).
-- ARGV[3+9(i-1)..11+9(i-1)]  of request i: count, q and r (the period in
--           µs is q·count + r, split in Go: the period itself may exceed
--           2^53), the period in µs rounded to a double (only to estimate,
--           as Go's float64(p) does), burst, hits, max debt, max wait in
--           whole µs (rounded down: a wait rounded up to the µs fits within
--           MaxWait exactly when it fits within this), shadow (0/1).
--
-- Returns {now, all admitted (0/1), then for each request:
--   allowed (0/1), exceeds burst (0/1), remaining, retry after µs,
--   reset after µs, wait µs,
--   and with ARGV[2] = "1":
--   the same six as answered when the Take is denied (in another slot),
--   give back (0/1: on the last request naming a key that this slot
--   admitted, when its state differs from what a denied Take leaves),
--   admitted TAT µs, admitted frac (the state the admitted Take leaves),
--   denied TAT µs, denied frac (the state a denied Take leaves)}.

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

-- The stored state: "TAT:Frac"; a missing key is a full bucket (State{}).
local function load(key)
  local v = redis.call('GET', key)
  if not v then
    return {0, 0}
  end
  local a, b = string.match(v, '^(-?%d+):(%d+)$')
  if not a then
    return error('ratelimitd: bucket ' .. key .. ' holds ' .. v .. ', not TAT:Frac')
  end
  return {tonumber(a), tonumber(b)}
end

local extras = ARGV[2] == '1'

local n = #KEYS
local reqs = {}
local stored = {} -- key → {us, frac}
for i = 1, n do
  local a = 2 + 9 * (i - 1)
  local hits, maxdebt = tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7])
  reqs[i] = {
    l = {
      count = tonumber(ARGV[a + 1]),
      q = tonumber(ARGV[a + 2]),
      r = tonumber(ARGV[a + 3]),
      period = tonumber(ARGV[a + 4]),
      burst = tonumber(ARGV[a + 5]),
      maxdebt = maxdebt,
    },
    hits = hits,
    charge = maxdebt > 0 and hits > 0, -- mirrors Request.Charge
    maxwait = tonumber(ARGV[a + 8]),
    shadow = ARGV[a + 9] == '1',
  }
  local key = KEYS[i]
  if not stored[key] then
    stored[key] = load(key)
  end
end

local function apply(r, s)
  return decide(r.l, s[1], s[2], now, r.hits, r.charge, r.maxwait)
end

-- mirrors DecideAll: each request sees the state left by the requests
-- before it that name the same key.
local cur = {}     -- key → {us, frac}: the state as the requests so far leave it
local touched = {} -- key → true when a request on it has hits > 0
local last = {}    -- key → the index of the last request naming it
local decisions = {}
local allowed = 1
for i = 1, n do
  local key = KEYS[i]
  local nus, nfr, d = apply(reqs[i], cur[key] or stored[key])
  cur[key] = {nus, nfr}
  decisions[i] = d
  if d[1] == 0 and not reqs[i].shadow then
    allowed = 0
  end
  if reqs[i].hits > 0 then
    touched[key] = true
  end
  last[key] = i
end

-- mirrors the end of DecideAll, for a denied Take: only post-paid charges
-- are applied, chained per key; the requests that were admitted report
-- their bucket as a check (hits 0) would; the others keep their denial.
local function denied()
  local cur2, d2 = {}, {}
  for i = 1, n do
    local key = KEYS[i]
    local s = cur2[key] or stored[key]
    if reqs[i].charge then
      local nus, nfr, d = apply(reqs[i], s)
      cur2[key] = {nus, nfr}
      d2[i] = d
    elseif decisions[i][1] == 1 then
      local _, _, d = decide(reqs[i].l, s[1], s[2], now, 0, false, 0)
      cur2[key] = s
      d2[i] = d
    else
      cur2[key] = s
      d2[i] = decisions[i]
    end
  end
  return cur2, d2
end

local curDenied, decisionsDenied
if allowed == 0 or extras then
  curDenied, decisionsDenied = denied()
end
local final = cur
if allowed == 0 then
  final, decisions = curDenied, decisionsDenied
end

local function same(a, b)
  return a[1] == b[1] and a[2] == b[2]
end

-- The write rule of DecideAll: a bucket that a request with hits > 0 left
-- in another state than the stored one. The key expires when the bucket is
-- full again (for a bucket in debt, after the debt is paid and it refills).
for key in pairs(touched) do
  local s = final[key]
  if not same(s, stored[key]) then
    local v = string.format('%.0f:%.0f', s[1], s[2])
    if server_clock then
      -- It expires when the server's clock (the one TIME read) passes the
      -- TAT: the key vanishing means exactly "full".
      redis.call('SET', key, v, 'PXAT', (divmod(ceil_us(s[1], s[2]) + 999, 1000)))
    else
      local l = reqs[last[key]].l
      redis.call('SET', key, v, 'PX', (divmod(ceil_us(sub(s[1], s[2], now, 0, l.count)) + 999, 1000)))
    end
  end
end

local out = {now, allowed}
for i = 1, n do
  for _, v in ipairs(decisions[i]) do
    out[#out + 1] = v
  end
  if extras then
    for _, v in ipairs(decisionsDenied[i]) do
      out[#out + 1] = v
    end
    local key = KEYS[i]
    local w, t = cur[key], curDenied[key]
    if allowed == 1 and last[key] == i and not same(w, t) then
      out[#out + 1] = 1
    else
      out[#out + 1] = 0
    end
    out[#out + 1] = w[1]
    out[#out + 1] = w[2]
    out[#out + 1] = t[1]
    out[#out + 1] = t[2]
  end
end
return out
