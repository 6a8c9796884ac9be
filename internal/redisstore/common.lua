-- ratelimitd: what every script of this package but take_one.lua has
-- after clock.lua (store.go prepends both): exact integer helpers that
-- mirror limiter/bucket.go, and the writes of a bucket's state.

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

-- mirrors State.Full
local function full(us, fr, now)
  return us < now or (us == now and fr == 0)
end

-- parse reads the value v of the bucket key, "TAT:Frac": us, frac; nil and
-- a message for anything else.
local function parse(key, v)
  local a, b = string.match(v, '^(-?%d+):(%d+)$')
  if not a then
    return nil, 'ratelimitd: bucket ' .. key .. ' holds ' .. v .. ', not TAT:Frac'
  end
  return a + 0, b + 0 -- digits (and a sign): coercion, cheaper than tonumber
end

-- put writes the state (us, fr) of a bucket that is not full at now to
-- key, expiring when the bucket is full again, and returns the value
-- written. With the server's clock the key expires when that clock (the
-- one TIME read) passes the TAT: the key vanishing means exactly "full".
-- With a caller's clock it expires after the time until full, counted
-- from the write.
--
-- The expiry goes as digits: a Lua number argument is formatted by Redis
-- as a double ("%.17g") and parsed back, which costs more than Lua's
-- integer format.
local function put(key, us, fr, now)
  local v = string.format('%d:%d', us, fr) -- Lua 5.1: as a C long
  if server_clock then
    redis.call('SET', key, v, 'PXAT', string.format('%d', (divmod(ceil_us(us, fr) + 999, 1000))))
  else
    redis.call('SET', key, v, 'PX', string.format('%d', (divmod(ceil_us(us, fr) - now + 999, 1000))))
  end
  return v
end

-- store writes the state (us, fr) of a bucket to key (see put), or deletes
-- the key if the bucket is full at now: a missing key is a full bucket.
local function store(key, us, fr, now)
  if full(us, fr, now) then
    redis.call('DEL', key)
  else
    put(key, us, fr, now)
  end
end
