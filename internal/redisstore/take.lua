-- ratelimitd take: applies Takes to their buckets, each all-or-nothing, one
-- after the other. For each Take (on a cluster: the requests of one Take in
-- one hash slot) it reads the state "TAT:Frac" of every bucket, decides
-- whether every request is admitted (a Shadow one need not be), and writes
-- what limiter.DecideAll says a store writes: if every request is
-- admitted, the takes, reservations and post-paid charges; if one is
-- denied, only the post-paid charges. It returns the states it read and
-- the time it decided at; the Go side runs limiter.DecideAll on them for the
-- numbers of the answer (remaining, retry after, reset after, wait), and
-- checks that it agrees on the admission. So the script holds only what
-- must be atomic: the admission and the state written. It is
-- limiter.Decide and limiter.DecideAll (limiter/bucket.go) step by step,
-- with the same integer arithmetic, on spans the Go side computed with
-- Limit.Span: see the "mirrors" comments.
-- Several Takes travel in one call when the Store coalesces them (one script
-- entry, one TIME, one reply for the call; a batch of more than 512 buckets
-- is split into several calls); each is still decided alone, on the state
-- the Takes before it left.
-- Go side: internal/redisstore/store.go (takeArgs, takeSpec, decodeTakeCmd)
-- and batch.go (merging). It starts with clock.lua, state.lua and
-- common.lua (store.go prepends them): now, read from ARGV[1] or the
-- server's TIME, and divmod, parse, rescale, less, sub, ceil_us, full, put,
-- store.
--
-- Lua numbers are doubles: every value below stays an integer under 2^53
-- for a valid limiter.Limit and Request (limiter.MaxTokens, MaxFill), and so
-- does everything returned (Redis truncates returned numbers to integers).
-- A written TAT is at most now + FillTime + MaxWait (2·MaxFill), which
-- stays below 2^53 µs for any now before 2055 (the slowest limit, 100 years
-- to fill, with the longest MaxWait, 100 years), and before 2155 without
-- reservations. Spans are computed in the frame of now (see step), where
-- none exceeds 2·MaxFill (plus however far a caller's clock stepped back).
--
-- KEYS      the buckets of every request of every Take, in order; a key may
--           repeat.
-- ARGV[1]   now in Unix microseconds, or "" for the server's TIME (every
--           Take of a call uses the same clock; clock.lua reads it).
-- ARGV[2..] the Takes, in order, each one of
--             spec                a Take of one request (its next KEY);
--             n, then n specs     a Take of n requests (its next n KEYS),
--                                 n in digits;
--             "*m", then spec     m alike Takes of one request each, all
--                                 on its next KEY (m ≥ 2), decided one
--                                 after the other in one step;
--           each but the first, with a caller's clock, after "@µs", its
--           own now (the first Take's is ARGV[1]). So a call of one
--           request is {now, spec}, as take_one.lua reads it: Redis and
--           the client handle every argument one by one, and most Takes
--           are of one request.
--   spec    a request's "kind:count:h µs:h frac:f µs:f frac:floor µs:floor
--           frac:period:cap", one argument (identical specs, as of requests alike
--           under one limit, are parsed once a call):
--           kind: "t" a take, "k" a check (hits 0), "x" hits above burst,
--             "c" a post-paid charge, "d" one recorded in a denied Take
--             only if it was itself denied (limiter.CountWhereDenied);
--             upper case when the request is Shadow;
--           count (the limit's, the denominator of every fraction; at
--             least 1),
--           h µs, h frac: the time of its hits (for a charge, of at most
--             burst + max debt of them),
--           f µs, f frac: the fill time (of burst tokens),
--           floor µs (a charge: the fill time plus that of max debt tokens,
--             the deepest a charge may go; otherwise the longest wait it
--             may reserve, in whole µs rounded down, 0 for none),
--           floor frac (a charge; otherwise 0),
--           period (the limit's, in µs: with count, the rate a state is
--             written under, see rescale),
--           cap (burst + max debt: the most tokens a rescaled state
--             keeps spent).
--
-- Returns one flat array, each Take's 2 + 2n slots after the one before
-- (n its requests; a group of alike Takes has the 4 slots of one, its
-- second the number of them admitted), in order:
--   now, all admitted (0/1), then for each request the state stored under
--   its key before the Take, rescaled to its limit's rate (see rescale;
--   the Take's first request on the key sets the rate): TAT µs, frac (0,
--   0 for a missing key);
-- or, if one of its buckets is a string other than a state or one of
-- its specs is malformed, an error reply, then 1 + 2n zeros (nothing of
-- that Take is written; the others are decided as usual). Flat, not an
-- array a Take: Redis makes and converts a Lua table for every nested
-- array, and go-redis a slice.
-- A key of another Redis type (a hash, a list...) is no error: MGET answers
-- nil for it, so it counts as a missing key, a full bucket, and a Take that
-- writes the bucket overwrites it.

-- The reply (see above): nr slots filled so far.
local replies, nr = {}, 0

-- fail fills the slots of a Take of n requests that failed with msg.
local function fail(n, msg)
  replies[nr + 1] = redis.error_reply(msg)
  for i = 2, 2 + 2 * n do
    replies[nr + i] = 0
  end
  nr = nr + 2 + 2 * n
end

-- under is State.under for a state s = {us, frac, rate} (rate as parse
-- reads it) as the request with spec p reads it at now: s, or s rescaled
-- to p's rate.
local function under(s, p, now)
  local us, fr, applied = rescale(s[1], s[2], s[3], p.count, p.per, p.rate, p.cap, now)
  if applied then
    return {us, fr, p.rate}
  end
  return s
end

-- The specs parsed so far in this call: spec string → its fields.
local specs = {}

-- spec is parse_spec (step.lua), parsing each spec string once a call.
local function spec(v)
  local p = specs[v]
  if p then
    return p
  end
  local err
  p, err = parse_spec(v)
  if p then
    specs[v] = p
  end
  return p, err
end

-- Every bucket of the call, read at once: key → its value, or false when
-- missing. The Takes update it as they write, so that each sees the state
-- the ones before it left.
-- shared says a key repeats (MGET answers false, not nil, for a missing
-- key).
local values, shared = {}, false
for first = 1, #KEYS, 1000 do -- unpack's results must fit Lua's C stack
  local last = math.min(first + 999, #KEYS)
  local got = redis.call('MGET', unpack(KEYS, first, last))
  for i = first, last do
    local key = KEYS[i]
    if values[key] ~= nil then
      shared = true
    end
    values[key] = got[i - first + 1]
  end
end

-- Each bucket's first write in this call is stored at once. When buckets
-- repeat (a limit every request names, such as one per model), the later
-- writes are kept in later: key → {us, frac, now of the Take that wrote it
-- last, rate}, listed in order, and each such bucket is
-- stored once more, after the last Take (see the end), in its last state,
-- rather than once a Take. The script runs atomically, so no one sees the
-- states in between.
local later, order = {}, {}

-- write records state (us, fr) under rate (":count:per"), decided at now,
-- for key, where the Takes after this one read it (see later).
local function write(key, us, fr, now, rate)
  values[key] = put(key, us, fr, now, rate)
end
if shared then
  write = function(key, us, fr, now, rate)
    local w = later[key]
    if w then
      w[1], w[2], w[3], w[4] = us, fr, now, rate
    elseif w == false then -- written once already
      later[key] = {us, fr, now, rate}
      order[#order + 1] = key
    else
      later[key] = false
      values[key] = put(key, us, fr, now, rate)
    end
  end
end

-- load returns the state of key as the Takes so far left it, as the
-- request with spec p reads it at now: us, frac, and the rate it is under
-- (":count:period", "" when unknown); a missing key is a full bucket
-- (State{}). A state written under another rate is
-- rescaled to p's (State.under) and written so at once: DecideAll writes
-- a rescaled state whatever the Take decides. A stored value other than a
-- state returns nil and a message.
local function load(key, p, now)
  local us, fr, r0
  local w = later[key]
  if w then
    us, fr, r0 = w[1], w[2], w[4]
  else
    local v = values[key]
    if not v then
      return 0, 0, ''
    end
    us, fr, r0 = parse(key, v)
    if not us then
      return nil, fr
    end
  end
  if r0 == p.rate or r0 == '' then -- rescale's first test, without the call
    return us, fr, r0
  end
  local rus, rfr, applied = rescale(us, fr, r0, p.count, p.per, p.rate, p.cap, now)
  if applied then
    write(key, rus, rfr, now, p.rate)
    return rus, rfr, p.rate
  end
  return us, fr, r0
end

-- decide is decide_single (step.lua), calling decide_one (single.lua)
-- itself for a request that is not a charge: one function call a Take
-- instead of three.
local function decide(p, us, fr, now)
  local kind = p.kind
  if kind == 'c' or kind == 'd' then
    return decide_single(p, us, fr, now)
  end
  local ok, nus, nfr, wrote = decide_one(kind, p.count, p.hus, p.hfr, p.fus, p.ffr, p.lus, us, fr, now)
  if ok or p.shadow then -- a Shadow request's denial denies nothing
    return nus, nfr, 1, wrote
  end
  return nus, nfr, 0, wrote
end

-- take_single is take (below) for a Take of one request, the common case,
-- without take's per-key tables: the request's spec is p. (take_one.lua is
-- the same for a call that carries nothing else and is not a charge.)
-- DecideAll's write rule: a state that moved, or that the request wrote
-- anew (under its own rate). A missing key, the common case where buckets
-- are many, is read without load, and one not shared is written without
-- write: each function call costs Lua about as much as a decision.
local function take_single(key, p, now)
  local us, fr, r0 = 0, 0, ''
  if values[key] or later[key] then
    us, fr, r0 = load(key, p, now)
    if not us then
      return fail(1, fr)
    end
  end
  local nus, nfr, allowed, wrote = decide(p, us, fr, now)
  if nus ~= us or nfr ~= fr or (wrote and r0 ~= p.rate) then
    if shared then
      write(key, nus, nfr, now, p.rate)
    else
      values[key] = put(key, nus, nfr, now, p.rate)
    end
  end
  replies[nr + 1], replies[nr + 2], replies[nr + 3], replies[nr + 4] = now, allowed, us, fr
  nr = nr + 4
end

-- take_many mirrors m alike takes (kind 't', hits > 0) of the request
-- with spec p, decided by decide_one one after the other on a bucket in
-- state (sus, sfr) at now, in one step. A take is admitted while before
-- (tat − now, never negative) is at most tau − h, or, for a reservation,
-- while its wait, ceil_us(before − (tau − h)), is at most maxwait: while
-- before ≤ bound = tau − h + maxwait µs. Each admitted one adds h, and the
-- first one denied leaves the state as it found it, as does every one
-- after it. So the first A are admitted, A the largest count with
-- (A − 1)·h ≤ bound − before, at most m. It returns the state after them
-- and A. Exact while (m + 1)·count < 2^53 (the caller checks): j·hfr is
-- formed for j ≤ m.
local function take_many(p, m, sus, sfr, now)
  local count, hus, hfr = p.count, p.hus, p.hfr
  local tus, tfr = before(sus, sfr, count, now)
  -- room = bound − before, where bound = (fus, ffr) − (hus, hfr) + maxwait
  local dus, dfr = p.fus - hus + p.lus - tus, p.ffr - hfr - tfr
  if dfr < 0 then
    dus, dfr = dus - 1, dfr + count
    if dfr < 0 then
      dus, dfr = dus - 1, dfr + count
    end
  end
  if dus < 0 then
    return sus, sfr, 0
  end
  -- q = floor(room / h): estimated in doubles, then made exact, counting
  -- j·h (µs, frac) ≤ room; only q < m matters.
  local q = math.floor((dus + dfr / count) / (hus + hfr / count))
  if not (q < m) then -- also a NaN
    q = m
  elseif q < 0 then
    q = 0
  end
  local jus, jfr = divmod(q * hfr, count)
  jus = jus + q * hus
  while q > 0 and (jus > dus or (jus == dus and jfr > dfr)) do
    q = q - 1
    jus, jfr = divmod(q * hfr, count)
    jus = jus + q * hus
  end
  while q < m do
    local nus, nfr = divmod((q + 1) * hfr, count)
    nus = nus + (q + 1) * hus
    if nus > dus or (nus == dus and nfr > dfr) then
      break
    end
    q = q + 1
  end
  local a = q + 1
  if a > m then
    a = m
  end
  -- the state after a takes: now + before + a·h
  local ahi, afr = divmod(a * hfr + tfr, count)
  return now + tus + a * hus + ahi, afr, a
end

-- take_group decides m alike Takes of the request with spec p on key at
-- now, one after the other, as take_single would one by one, and writes
-- the state the last one leaves once. Its slots: now, how many were
-- admitted, and the state before the first (the Go side works out each
-- one's answer from it, and checks the count). Takes are decided by
-- take_many in one step; other kinds one by one, until one leaves the
-- state as it found it: every one after it does the same and is answered
-- the same.
local function take_group(key, p, m, now)
  local us, fr, r0 = load(key, p, now)
  if not us then
    return fail(1, fr)
  end
  local cus, cfr, wrote, admitted = us, fr, false, 0
  if p.kind == 't' and (m + 1) * p.count < 9007199254740992 then -- 2^53
    cus, cfr, admitted = take_many(p, m, us, fr, now)
    wrote = admitted > 0
    if p.shadow then -- a Shadow request's denial denies nothing
      admitted = m
    end
  else
    for j = 1, m do
      local nus, nfr, allowed, w = decide(p, cus, cfr, now)
      if nus == cus and nfr == cfr then
        admitted = admitted + allowed * (m - j + 1)
        wrote = wrote or w
        break
      end
      admitted, wrote = admitted + allowed, wrote or w
      cus, cfr = nus, nfr
    end
  end
  if cus ~= us or cfr ~= fr or (wrote and r0 ~= p.rate) then
    write(key, cus, cfr, now, p.rate)
  end
  replies[nr + 1], replies[nr + 2], replies[nr + 3], replies[nr + 4] = now, admitted, us, fr
  nr = nr + 4
end

-- take decides the Take whose n requests are KEYS[k+1..k+n] and whose
-- arguments start at ARGV[a] (n), at now, writes what it says, and fills
-- its slots of the reply. Request i's spec is ARGV[a + i].
local function take(k, a, n, now)
  local ps = {} -- request i's spec
  for i = 1, n do
    local p, err = spec(ARGV[a + i])
    if not p then
      return fail(n, err)
    end
    ps[i] = p
  end
  local out = nr -- the Take's slots are replies[out + 1 .. out + 2 + 2n]
  replies[out + 1], replies[out + 2] = now, 1
  local stored = {} -- key → {us, frac, rate} (see load)
  for i = 1, n do
    local key = KEYS[k + i]
    local s = stored[key]
    if not s then
      local us, fr, r0 = load(key, ps[i], now)
      if not us then
        return fail(n, fr) -- from out, overwriting what was filled
      end
      s = {us, fr, r0}
      stored[key] = s
    end
    replies[out + 2 * i + 1], replies[out + 2 * i + 2] = s[1], s[2]
  end

  -- mirrors DecideAll: each request sees the state left by the requests
  -- before it that name the same key, rescaled to its own rate when
  -- another left it (State.under in Decide).
  local cur = {} -- key → {us, frac, rate}: the state as the requests so far leave it
  local oks = {} -- request i → whether it was admitted in this pass
  local allowed = true
  for i = 1, n do
    local key, p = KEYS[k + i], ps[i]
    local s = under(cur[key] or stored[key], p, now)
    local nus, nfr, ok, wrote = step(p, s[1], s[2], now)
    if wrote then
      s = {nus, nfr, p.rate}
    end
    cur[key] = s
    oks[i] = ok
    -- a Shadow request's denial denies nothing
    if not ok and not p.shadow then
      allowed = false
    end
  end

  -- mirrors DecideDenied: a denied Take applies only post-paid charges
  -- ('d': those that were denied above), chained per key.
  if not allowed then
    replies[out + 2] = 0
    cur = {}
    for i = 1, n do
      local key, p = KEYS[k + i], ps[i]
      -- each leaves its bucket as it reads it (DecideDenied), rescaled
      local s = under(cur[key] or stored[key], p, now)
      if p.kind == 'c' or (p.kind == 'd' and not oks[i]) then
        local nus, nfr = step(p, s[1], s[2], now)
        s = {nus, nfr, p.rate}
      end
      cur[key] = s
    end
  end

  -- The write rule of DecideAll: a bucket the requests left in another
  -- state than the stored one (only a request with hits > 0 changes one).
  for key, s in pairs(cur) do
    local was = stored[key]
    if s[1] ~= was[1] or s[2] ~= was[2] or s[3] ~= was[3] then
      write(key, s[1], s[2], now, s[3])
    end
  end
  nr = out + 2 + 2 * n
end

-- The Takes, one after the other. clock.lua set now from ARGV[1]: the
-- server's TIME, read once for the call, or the first Take's own now; an
-- "@µs" (a caller's clock) sets the now of the Takes after it.
local k, a, tnow = 0, 2, now
while a <= #ARGV do
  local v = ARGV[a]
  local c = string.byte(v, 1)
  if c == 64 then -- '@'
    tnow = tonumber(string.sub(v, 2))
    a = a + 1
  elseif c == 42 then -- '*': m alike Takes, then their spec
    local p, err = spec(ARGV[a + 1])
    if p then
      take_group(KEYS[k + 1], p, tonumber(string.sub(v, 2)), tnow)
    else
      fail(1, err)
    end
    k, a = k + 1, a + 2
  elseif c and c >= 48 and c <= 57 then -- a digit: n, then n specs
    local n = tonumber(v)
    take(k, a, n, tnow)
    k, a = k + n, a + 1 + n
  else -- a spec: a Take of one request
    local p, err = specs[v]
    if not p then
      p, err = spec(v)
    end
    if p then
      take_single(KEYS[k + 1], p, tnow)
    else
      fail(1, err)
    end
    k, a = k + 1, a + 1
  end
end
-- Each bucket more than one Take changed, stored in its last state; with a
-- caller's clock the key expires counting from the now of the Take that
-- left that state, as if it had been written then.
for i = 1, #order do
  local key = order[i]
  local w = later[key]
  put(key, w[1], w[2], w[3], w[4])
end
return replies
