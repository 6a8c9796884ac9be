-- ratelimitd: what every script of this package but take_one.lua has
-- after clock.lua and state.lua (store.go prepends them): exact integer
-- helpers that mirror limiter/bucket.go, and store, a bucket's write or
-- its deletion when full.

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

-- store writes the state (us, fr) of a bucket to key (see put), or deletes
-- the key if the bucket is full at now: a missing key is a full bucket.
local function store(key, us, fr, now, rate)
  if full(us, fr, now) then
    redis.call('DEL', key)
  else
    put(key, us, fr, now, rate)
  end
end
