-- ratelimitd take: applies the requests of one Take (or, on a cluster, the
-- requests of one hash slot) to their buckets all-or-nothing, reading the
-- state "TAT:Frac" of every bucket first and writing only if every request is
-- admitted. It is limiter.DecideAll and limiter.Decide (limiter/bucket.go)
-- step by step, with the same integer arithmetic: see the "mirrors" comments.
-- Go side: internal/redisstore/store.go (Store.Take, decodeTake).
--
-- Lua numbers are doubles: every value below stays an integer under 2^53 for
-- a valid limiter.Limit (limiter.MaxTokens, MaxFill) and a now before the
-- year 2155, and so does everything returned (Redis truncates returned
-- numbers to integers). See decide for the one place where that takes care.
--
-- KEYS[i]   the bucket of request i; a key may repeat.
-- ARGV[1]   now in Unix microseconds, or "" to read the server's TIME.
-- ARGV[2]   "1" to add, per request, the check on the stored state and the
--           give-back record (used when one Take spans several slots).
-- ARGV[3+6(i-1)..8+6(i-1)]  of request i: count, q and r (the period in µs
--           is q·count + r, split in Go: the period itself may exceed 2^53),
--           the period in µs rounded to a double (only to estimate, as Go's
--           float64(p) does), burst, hits.
--
-- Returns {now, all admitted (0/1), then for each request:
--   allowed (0/1), exceeds burst (0/1), remaining, retry after µs, reset after µs,
--   and with ARGV[2] = "1":
--   the same five for a check (hits 0) on the stored state,
--   written (0/1, on the last request naming a key that was written),
--   stored present (0/1), stored TAT µs, stored frac, written TAT µs, written frac}.

-- floor(a/b) and a mod b for integers, exact: the division in doubles is
-- only an estimate, corrected by one step.
local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q, r = q - 1, r + b
  elseif r >= b then
    q, r = q + 1, r - b
  end
  return q, r
end

-- mirrors instant.less
local function less(aus, afr, bus, bfr)
  return aus < bus or (aus == bus and afr < bfr)
end

-- mirrors instant.sub (a ≥ b)
local function sub(aus, afr, bus, bfr, count)
  local us, fr = aus - bus, afr - bfr
  if fr < 0 then
    fr = fr + count
    us = us - 1
  end
  return us, fr
end

-- mirrors instant.ceilDuration, in µs
local function ceil_us(us, fr)
  if fr > 0 then
    return us + 1
  end
  return us
end

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
-- {allowed, exceeds, remaining, retry µs, reset µs}.
-- It works in the frame of now: where Decide computes next = advance(tat,
-- hits) and then used = next − now, this computes used = advance(tat − now,
-- hits) directly, the same integers. It matters for doubles: a bucket with
-- a 100-year fill denied a full burst has next up to now + 2·MaxFill, past
-- 2^53 µs after the year 2055, while used stays below 2·MaxFill. A written
-- TAT is at most now + MaxFill.
local function decide(l, sus, sfr, now, hits)
  local tus, tfr = sus - now, math.min(sfr, l.count - 1) -- tat − now
  if less(tus, tfr, 0, 0) then
    tus, tfr = 0, 0
  end
  local fus, ffr = advance(l, 0, 0, l.burst) -- tau, Limit.fillTime
  if hits > l.burst then
    return sus, sfr, {0, 1, 0, 0, ceil_us(tus, tfr)}
  end
  local uus, ufr = advance(l, tus, tfr, hits) -- used: time until full again
  if less(fus, ffr, uus, ufr) then
    return sus, sfr, {0, 0, 0, ceil_us(sub(uus, ufr, fus, ffr, l.count)), ceil_us(tus, tfr)}
  end
  local d = {1, 0, tokens_in(l, sub(fus, ffr, uus, ufr, l.count)), 0, ceil_us(uus, ufr)}
  if hits == 0 then
    return sus, sfr, d
  end
  return now + uus, ufr, d -- next
end

-- The stored state: "TAT:Frac"; a missing key is a full bucket (State{}).
local function load(key)
  local v = redis.call('GET', key)
  if not v then
    return false, 0, 0
  end
  local a, b = string.match(v, '^(-?%d+):(%d+)$')
  if not a then
    return error('ratelimitd: bucket ' .. key .. ' holds ' .. v .. ', not TAT:Frac')
  end
  return true, tonumber(a), tonumber(b)
end

local now
if ARGV[1] == '' then
  -- Redis < 5 replicates scripts verbatim unless told otherwise, and a
  -- verbatim script may not write after TIME; Redis ≥ 7 ignores this.
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local extras = ARGV[2] == '1'

local n = #KEYS
local limits, hits = {}, {}
local stored = {} -- key → {present, us, frac}
for i = 1, n do
  local a = 2 + 6 * (i - 1)
  limits[i] = {
    count = tonumber(ARGV[a + 1]),
    q = tonumber(ARGV[a + 2]),
    r = tonumber(ARGV[a + 3]),
    period = tonumber(ARGV[a + 4]),
    burst = tonumber(ARGV[a + 5]),
  }
  hits[i] = tonumber(ARGV[a + 6])
  local key = KEYS[i]
  if not stored[key] then
    local present, us, fr = load(key)
    stored[key] = {present, us, fr}
  end
end

-- mirrors DecideAll: each request sees the state left by the requests
-- before it that name the same key.
local cur = {}     -- key → {us, frac}: the state as the requests so far leave it
local written = {} -- key → true when a request on it spends tokens
local last = {}    -- key → the index of the last request naming it
local decisions = {}
local allowed = 1
for i = 1, n do
  local key = KEYS[i]
  local s = cur[key] or {stored[key][2], stored[key][3]}
  local nus, nfr, d = decide(limits[i], s[1], s[2], now, hits[i])
  cur[key] = {nus, nfr}
  decisions[i] = d
  if d[1] == 0 then
    allowed = 0
  end
  if hits[i] > 0 then
    written[key] = true
  end
  last[key] = i
end

local function check(i)
  local s = stored[KEYS[i]]
  local _, _, d = decide(limits[i], s[2], s[3], now, 0)
  return d
end

if allowed == 1 then
  for key in pairs(written) do
    local l = limits[last[key]]
    local s = cur[key]
    local ms
    if ARGV[1] == '' then
      -- The key expires when the server's clock (the one TIME read) passes
      -- the TAT: the key vanishing means exactly "full".
      ms = divmod(ceil_us(s[1], s[2]) + 999, 1000)
      redis.call('SET', key, string.format('%.0f:%.0f', s[1], s[2]))
      redis.call('PEXPIREAT', key, ms)
    else
      ms = divmod(ceil_us(sub(s[1], s[2], now, 0, l.count)) + 999, 1000)
      redis.call('SET', key, string.format('%.0f:%.0f', s[1], s[2]), 'PX', ms)
    end
  end
else
  -- mirrors the end of DecideAll: nothing is written, and the requests that
  -- would have passed report their bucket as a check on the stored state.
  for i = 1, n do
    if decisions[i][1] == 1 then
      decisions[i] = check(i)
    end
  end
end

local out = {now, allowed}
for i = 1, n do
  for _, v in ipairs(decisions[i]) do
    out[#out + 1] = v
  end
  if extras then
    for _, v in ipairs(check(i)) do
      out[#out + 1] = v
    end
    local key = KEYS[i]
    local s, c = stored[key], cur[key]
    if allowed == 1 and written[key] and last[key] == i then
      out[#out + 1] = 1
    else
      out[#out + 1] = 0
    end
    out[#out + 1] = s[1] and 1 or 0
    out[#out + 1] = s[2]
    out[#out + 1] = s[3]
    out[#out + 1] = c[1]
    out[#out + 1] = c[2]
  end
end
return out
