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
-- It starts with clock.lua (server_clock, now) and nothing else: not
-- common.lua and step.lua, whose arithmetic for these kinds it writes out
-- in one flat chunk, because a script's local functions and tables are
-- made anew on every call, which cost a lone call about a sixth of its
-- time in Redis. Each step names what it mirrors there;
-- TestMatchesDecideAll* hold both scripts to limiter.DecideAll.

local key, spec = KEYS[1], ARGV[2]
local kind, count, hus, hfr, fus, ffr, maxwait = string.match(spec or '',
  '^([tkxTKX]):([1-9]%d*):(%d+):(%d+):(%d+):(%d+):(%d+):%d+$')
if not kind then
  return {redis.error_reply('ratelimitd: malformed request spec ' .. tostring(spec)), 0, 0, 0}
end
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
if v then
  local a, b = string.match(v, '^(-?%d+):(%d+)$')
  if not a then
    return {redis.error_reply('ratelimitd: bucket ' .. key .. ' holds ' .. v .. ', not TAT:Frac'), 0, 0, 0}
  end
  sus, sfr = a + 0, b + 0
end

-- step, in the frame of now: before = tat − now (never negative), and
-- the request is admitted if before ≤ tau − h
local admitted = false
if kind ~= 'x' then -- hits above burst: never admitted
  local tus, tfr = sus - now, sfr
  if tfr > count - 1 then
    tfr = count - 1
  end
  if tus < 0 then
    tus, tfr = 0, 0
  end
  local rus, rfr = fus - hus, ffr - hfr -- sub: tau − h
  if rfr < 0 then
    rus, rfr = rus - 1, rfr + count
  end
  admitted = rus > tus or (rus == tus and rfr >= tfr)
  if not admitted and kind == 't' and maxwait > 0 then
    -- a reservation: admitted if its tokens arrive within the longest
    -- wait, ceil_us(before − (tau − h)) ≤ maxwait
    local wus, wfr = tus - rus, tfr - rfr
    if wfr < 0 then
      wus, wfr = wus - 1, wfr + count
    end
    if wfr > 0 then
      wus = wus + 1
    end
    admitted = wus <= maxwait
  end
  if admitted and kind == 't' then
    -- add: the new state is now + before + h
    local nus, nfr = tus + hus, tfr + hfr
    if nfr >= count then
      nus, nfr = nus + 1, nfr - count
    end
    nus = now + nus
    -- decide_single's write rule: only a changed state is written; put:
    -- the key expires when the bucket is full again, at ceil_us(TAT) in
    -- ms rounded up (PXAT on the server's clock, else PX counted from
    -- now), divided as divmod does, exactly for any integer below 2^53
    if nus ~= sus or nfr ~= sfr then
      local e = nus
      if nfr > 0 then
        e = e + 1
      end
      if not server_clock then
        e = e - now
      end
      e = e + 999
      local ms = math.floor(e / 1000)
      local r = e - ms * 1000
      if r < 0 then
        ms = ms - 1
      elseif r >= 1000 then
        ms = ms + 1
      end
      redis.call('SET', key, string.format('%d:%d', nus, nfr), server_clock and 'PXAT' or 'PX', string.format('%d', ms))
    end
  end
end

-- a Shadow request's denial denies nothing
local allowed = 0
if admitted or shadow then
  allowed = 1
end
return {now, allowed, sus, sfr}
