-- ratelimitd take, one request: take.lua for a call that carries one Take
-- of one request that is not a post-paid charge (kind t, k or x, Shadow or
-- not), the common call while calls come one at a time (the Store then
-- sends each at once, alone). Its arguments and reply are take.lua's for
-- such a call:
--
-- KEYS[1]   the bucket.
-- ARGV[1]   now in Unix microseconds, or "" for the server's TIME;
-- ARGV[2]   the request's spec (kind t, k or x; a charge is malformed
--           here: the Store sends those to take.lua).
--
-- Returns {now, admitted (0/1), TAT µs, frac of the stored state before
-- the Take}, or {an error reply, 0, 0, 0} for a malformed spec or a bucket
-- that holds something other than "TAT:Frac": take.lua's reply to one
-- Take.
--
-- It starts with clock.lua (server_clock, now) and single.lua (decide_one,
-- the decision of these kinds, shared with take.lua) and nothing else: not
-- common.lua and step.lua, whose parts it needs it writes out in one flat
-- chunk, because a script's local functions and tables are made anew on
-- every call, which cost a lone call about a sixth of its time in Redis.
-- Each part names what it mirrors there; TestMatchesDecideAll* hold both
-- scripts to limiter.DecideAll.

local key, spec = KEYS[1], ARGV[2]
local kind, count, hus, hfr, fus, ffr, maxwait, per, cap = string.match(spec or '',
  '^([tkxTKX]):([1-9]%d*):(%d+):(%d+):(%d+):(%d+):(%d+):%d+:([1-9]%d*):(%d+)$')
if not kind then
  return {redis.error_reply('ratelimitd: malformed request spec ' .. tostring(spec)), 0, 0, 0}
end
-- what a written state ends with: the rate it is under (common.lua's put)
local rate = ':' .. count .. ':' .. per
-- digits only (the pattern says so): "+ 0" converts as tonumber would,
-- for less
count, hus, hfr, fus, ffr, maxwait = count + 0, hus + 0, hfr + 0, fus + 0, ffr + 0, maxwait + 0
local shadow = kind == 'T' or kind == 'K' or kind == 'X'
kind = string.lower(kind)

-- the stored state (parse): a missing key, or one of another type (GET
-- answers WRONGTYPE, which pcall returns as a table), is a full bucket, as
-- take.lua's MGET reads it; any other error ends the script, as it would
-- through redis.call
local v = redis.pcall('GET', key)
if type(v) == 'table' then
  if not string.find(v.err or '', '^WRONGTYPE') then
    return v
  end
  v = false
end
local sus, sfr = 0, 0
-- divmod (common.lua): floor(a/b) and a mod b, exact for integers
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
local stored_us, stored_fr -- the state as stored, when rescaled
if v then
  local a, b, c0, p0 = string.match(v, '^(-?%d+):(%d+):(%d+):(%d+)$')
  if not a then
    a, b = string.match(v, '^(-?%d+):(%d+)$')
    if not a then
      return {redis.error_reply('ratelimitd: bucket ' .. key .. ' holds ' .. v .. ', not TAT:Frac:Count:Period'), 0, 0, 0}
    end
  end
  sus, sfr = a + 0, b + 0
  -- rescale (common.lua) when written under another rate
  if c0 then
    c0, p0 = c0 + 0, p0 + 0
    local per_n, cap_n = per + 0, cap + 0
    if c0 >= 1 and p0 >= 1 and (c0 ~= count or p0 ~= per_n) and sus >= now then
      local n = ((sus - now) * c0 + math.min(sfr, c0 - 1)) / p0
      if n > cap_n then
        n = cap_n
      end
      local span = n * per_n / count
      local q = math.floor(span)
      local r = math.floor((span - q) * count)
      stored_us, stored_fr = sus, sfr
      sus, sfr = now + q, math.max(0, math.min(r, count - 1))
    end
  end
end

-- the state to write, if any: a rescaled state is written whatever the
-- Take decides (DecideAll's write rule)
local wus, wfr
if stored_us then
  wus, wfr = sus, sfr
end

-- the decision (single.lua), and decide_single's write rule: only a
-- changed state is written
local admitted, nus, nfr = decide_one(kind, count, hus, hfr, fus, ffr, maxwait, sus, sfr, now)
if nus ~= sus or nfr ~= sfr then
  wus, wfr = nus, nfr
end

-- put: the key expires when the bucket is full again, at ceil_us(TAT) in
-- ms rounded up (PXAT on the server's clock, else PX counted from now),
-- divided as divmod does, exactly for any integer below 2^53. A rescaled
-- state may be full: the key then goes, as common.lua's store does.
if wus then
  local e = wus
  if wfr > 0 then
    e = e + 1
  end
  if not server_clock then
    e = e - now
  end
  local ms = divmod(e + 999, 1000)
  if ms > 0 then
    redis.call('SET', key, string.format('%d:%d', wus, wfr) .. rate, server_clock and 'PXAT' or 'PX', string.format('%d', ms))
  else
    redis.call('DEL', key)
  end
end

-- a Shadow request's denial denies nothing
local allowed = 0
if admitted or shadow then
  allowed = 1
end
return {now, allowed, sus, sfr}
