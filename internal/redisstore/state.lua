-- ratelimitd: a bucket's stored state, read and written, what every
-- script of this package has after clock.lua (store.go prepends both):
-- divmod; parse and rescale, which mirror limiter.State's reading and
-- State.under; put, its write.

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

-- parse reads the value v of the bucket key, "TAT:Frac:Count:Period"
-- (limiter.State: Count and Period, in µs, are the rate it was written
-- under) or "TAT:Frac" (ratelimitd's first format, rate unknown): us,
-- frac, and the rate as put writes it, ":Count:Period" ("" when unknown);
-- nil and a message for anything else. The rate stays a string: a reader
-- compares it with its own (rescale), and reads its numbers only when they
-- differ, which is rare.
local function parse(key, v)
  local a, b, r = string.match(v, '^(-?%d+):(%d+)(:%d+:%d+)$')
  if not a then
    a, b = string.match(v, '^(-?%d+):(%d+)$')
    if not a then
      return nil, 'ratelimitd: bucket ' .. key .. ' holds ' .. v .. ', not TAT:Frac:Count:Period'
    end
    r = ''
  end
  return a + 0, b + 0, r -- digits (and a sign): coercion, cheaper than tonumber
end

-- rescale mirrors State.under, operation for operation in doubles: the
-- state (us, fr) written under the rate r0 (":count:period", as parse
-- reads it), as a limit of count tokens every per µs, whose rate is rate,
-- reads it at now, with cap = Burst + MaxDebt: unchanged when written
-- under that rate (or an unknown one) or full; otherwise the tokens it had
-- spent, at most cap of them, spent at the new rate, rounded down to
-- 1/count µs. The third result says whether it rescaled.
local function rescale(us, fr, r0, count, per, rate, cap, now)
  if r0 == rate or r0 == '' or us < now then
    return us, fr, false
  end
  local c0, p0 = string.match(r0, '^:(%d+):(%d+)$')
  c0, p0 = c0 + 0, p0 + 0
  if c0 < 1 or p0 < 1 or (c0 == count and p0 == per) then
    return us, fr, false
  end
  local n = ((us - now) * c0 + math.min(fr, c0 - 1)) / p0
  if n > cap then
    n = cap
  end
  local span = n * per / count
  local q = math.floor(span)
  local r = math.floor((span - q) * count)
  return now + q, math.max(0, math.min(r, count - 1)), true
end

-- put writes the state (us, fr) of a bucket to key (deleting it, and
-- returning false, if the bucket is full at now), with rate, ":Count:Period"
-- of the limit that wrote it, expiring when the bucket is full again, and
-- returns the value written. With the server's clock the key expires when
-- that clock (the one TIME read) passes the TAT: the key vanishing means
-- exactly "full". With a caller's clock it expires after the time until
-- full, counted from the write.
--
-- The expiry goes as digits: a Lua number argument is formatted by Redis
-- as a double ("%.17g") and parsed back, which costs more than Lua's
-- integer format. Formatting is most of what a write costs in Lua (a
-- sprintf a number), so put keeps the last value and expiry it formatted:
-- the Takes of one call that find their buckets full, under one limit,
-- write the same state (now + the time of their hits) and expire at the
-- same millisecond.
local put_us, put_fr, put_rate, put_v, put_ms, put_px
local function put(key, us, fr, now, rate)
  if us < now or (us == now and fr == 0) then -- full: only a rescaled state can be (see load)
    redis.call('DEL', key)
    return false
  end
  if us ~= put_us or fr ~= put_fr or rate ~= put_rate then
    put_us, put_fr, put_rate = us, fr, rate
    put_v = string.format('%d:%d', us, fr) .. rate -- Lua 5.1: as a C long
  end
  local e = us -- ceil_us
  if fr > 0 then
    e = e + 1
  end
  if not server_clock then
    e = e - now
  end
  local ms = divmod(e + 999, 1000)
  if ms ~= put_ms then
    put_ms, put_px = ms, string.format('%d', ms)
  end
  redis.call('SET', key, put_v, server_clock and 'PXAT' or 'PX', put_px)
  return put_v
end
