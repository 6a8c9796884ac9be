-- ratelimitd: the decision of one request that is not a post-paid charge
-- (kind t, k or x), written out flat: store.go puts it after clock.lua in
-- take_one.lua and after step.lua in take.lua, whose step uses it for these
-- kinds. A Lua function call costs about as much as the arithmetic it
-- saves writing again, so this is one function with no helpers.

-- decide_one mirrors limiter.Decide for a request of kind 't' (a take),
-- 'k' (a check, hits 0) or 'x' (hits above burst, never admitted), with
-- count, the time of its hits (hus, hfr), the fill time (fus, ffr) and
-- the longest wait it may reserve (maxwait, whole µs), on a bucket in
-- state (sus, sfr) at now. It returns whether it is admitted, the state
-- after it, and whether that state is a new one under the request's rate
-- (a take admitted) rather than the one it read. It works in the frame of
-- now, as step (step.lua) says why: before = tat − now, never negative,
-- and the request is admitted if before ≤ tau − h.
local function decide_one(kind, count, hus, hfr, fus, ffr, maxwait, sus, sfr, now)
  if kind == 'x' then
    return false, sus, sfr, false
  end
  local tus, tfr = sus - now, sfr
  if tfr > count - 1 then
    tfr = count - 1
  end
  if tus < 0 then
    tus, tfr = 0, 0
  end
  local rus, rfr = fus - hus, ffr - hfr -- instant.sub: tau − h
  if rfr < 0 then
    rus, rfr = rus - 1, rfr + count
  end
  local admitted = rus > tus or (rus == tus and rfr >= tfr)
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
    -- instant.add: the new state is now + before + h
    local nus, nfr = tus + hus, tfr + hfr
    if nfr >= count then
      nus, nfr = nus + 1, nfr - count
    end
    return true, now + nus, nfr, true
  end
  return admitted, sus, sfr, false
end
