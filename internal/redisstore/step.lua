-- ratelimitd: the admission arithmetic of take.lua (store.go puts it
-- after clock.lua, state.lua, common.lua and single.lua, before take.lua):
-- limiter.Decide (limiter/bucket.go) for one request, on a spec parsed
-- from take.lua's arguments (its header gives their layout and the bounds
-- that keep every number an exact integer in a double). A take, a check
-- and hits above burst are single.lua's decide_one; a post-paid charge is
-- decided here.

-- t + u, both with fractions of count.
local function add(tus, tfr, uus, ufr, count)
  local us, fr = tus + uus, tfr + ufr
  if fr >= count then
    return us + 1, fr - count
  end
  return us, fr
end

-- before is tat − now for a bucket in state (sus, sfr) at now, in the
-- frame of now (see step): never negative, its fraction at most
-- count − 1. (decide_one, on the path of every take, has it written out.)
local function before(sus, sfr, count, now)
  local tus, tfr = sus - now, math.min(sfr, count - 1)
  if tus < 0 then
    return 0, 0
  end
  return tus, tfr
end

-- step mirrors Decide for the request with spec p (see parse_spec), on a bucket
-- in state (sus, sfr) at now: it returns the state after it, whether it
-- is admitted, and whether that state is a new one, under p's rate (a
-- take or reservation admitted, a charge), rather than the one it read.
-- It works in the frame of now: where Decide computes next = tat + span(
-- hits) and then used = next − now, this computes used = (tat − now) + h
-- directly, the same integers. It matters for doubles: a bucket with a
-- 100-year fill and a reservation 100 years ahead has tat − now up to
-- 2·MaxFill; adding a burst to it would pass 2^53, so "used > tau" is
-- decided as "tat − now > tau − h", and used is formed only when it is at
-- most tau + MaxWait (for a charge: at most its floor, tau + MaxDebt's
-- time, or tat − now when that is deeper).
local function step(p, sus, sfr, now)
  local kind = p.kind
  if kind ~= 'c' and kind ~= 'd' then
    local ok, nus, nfr, wrote = decide_one(kind, p.count, p.hus, p.hfr, p.fus, p.ffr, p.lus, sus, sfr, now)
    return nus, nfr, ok, wrote
  end
  local count = p.count
  local tus, tfr = before(sus, sfr, count, now)
  local hus, hfr = p.hus, p.hfr
  local fus, ffr = p.fus, p.ffr
  -- mirrors Limit.charge: never deeper than the floor, nor fuller than
  -- before; admitted unless in debt before.
  local lus, lfr = p.lus, p.lfr
  if less(lus, lfr, tus, tfr) then
    lus, lfr = tus, tfr
  end
  -- used = min(before + h, floor), decided as "before > floor − h" so
  -- that the sum is formed only when it is at most the floor (floor ≥ h:
  -- h is the time of at most burst + max debt tokens).
  local uus, ufr = lus, lfr
  local mus, mfr = sub(lus, lfr, hus, hfr, count)
  if not less(mus, mfr, tus, tfr) then
    uus, ufr = add(tus, tfr, hus, hfr, count)
  end
  return now + uus, ufr, not less(fus, ffr, tus, tfr), true
end

-- decide_single mirrors DecideAll for a Take of one request, with spec p,
-- on a bucket in state (us, fr) at now: it returns the state to store,
-- whether the Take is admitted (1 or 0), and whether that state is a new
-- one under p's rate (see step).
local function decide_single(p, us, fr, now)
  local nus, nfr, ok, wrote = step(p, us, fr, now)
  if ok or p.shadow then -- a Shadow request's denial denies nothing
    return nus, nfr, 1, wrote
  end
  -- mirrors DecideDenied: a denied Take writes only a post-paid charge
  -- (the one request was denied: 'd' is written too)
  if p.kind == 'c' or p.kind == 'd' then
    return nus, nfr, 0, true
  end
  return us, fr, 0, false
end

-- parse_spec returns the fields of the spec string v (take.lua's header
-- gives its layout): kind (lower case), shadow, count, hus, hfr, fus, ffr,
-- lus, lfr (the floor), per, cap, and rate (":count:per", what put writes
-- after a state); nil and a message if v is malformed.
local function parse_spec(v)
  local k, c, hus, hfr, fus, ffr, lus, lfr, per, cap = string.match(v or '',
    '^([tkxcdTKXCD]):([1-9]%d*):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):([1-9]%d*):(%d+)$')
  if not k then
    return nil, 'ratelimitd: malformed request spec ' .. tostring(v)
  end
  local kind = string.lower(k)
  -- Every field is digits only (the pattern says so): "+ 0" converts it
  -- as tonumber would, at a third of the cost, the most of a call's work.
  return {
    kind = kind, shadow = kind ~= k, count = c + 0,
    hus = hus + 0, hfr = hfr + 0, fus = fus + 0, ffr = ffr + 0,
    lus = lus + 0, lfr = lfr + 0, per = per + 0, cap = cap + 0,
    rate = ':' .. c .. ':' .. per,
  }
end
