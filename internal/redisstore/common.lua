-- ratelimitd: what every script of this package starts with (store.go
-- prepends it): exact integer helpers that mirror limiter/bucket.go, and
-- the clock. ARGV[1] is now in Unix microseconds, or "" to read the
-- server's TIME (then server_clock is true).

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

local server_clock = ARGV[1] == ''
local now
if server_clock then
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
