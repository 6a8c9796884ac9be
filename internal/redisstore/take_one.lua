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
-- It starts with clock.lua (server_clock, now), state.lua (divmod, parse,
-- rescale, put) and single.lua (decide_one, the decision of these kinds,
-- shared with take.lua) and nothing else: not common.lua and step.lua,
-- because a script's local functions and tables are made anew on every
-- call, which cost a lone call about a sixth of its time in Redis. TestMatchesDecideAll* hold both scripts to
-- limiter.DecideAll.

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
local stored_us, stored_fr -- the state as stored, when rescaled
if v then
  local r0
  sus, sfr, r0 = parse(key, v)
  if not sus then
    return {redis.error_reply(sfr), 0, 0, 0}
  end
  local rus, rfr, applied = rescale(sus, sfr, r0, count, per + 0, rate, cap + 0, now)
  if applied then
    stored_us, stored_fr = sus, sfr
    sus, sfr = rus, rfr
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

-- put (state.lua): the key expires when the bucket is full again; a
-- rescaled state may be full, and the key then goes.
if wus then
  put(key, wus, wfr, now, rate)
end

-- a Shadow request's denial denies nothing
local allowed = 0
if admitted or shadow then
  allowed = 1
end
return {now, allowed, sus, sfr}
