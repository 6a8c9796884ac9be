-- ratelimitd take, one request: take.lua for a call that carries one Take
-- of one request and nothing else, the common call while calls come one
-- at a time (the Store then sends each at once, alone), without the
-- tables and loops that merged calls need. Its arguments and reply are
-- take.lua's for such a call:
--
-- KEYS[1]   the bucket.
-- ARGV[1]   now in Unix microseconds, or "" for the server's TIME;
-- ARGV[2]   "1";
-- ARGV[3]   the request's spec.
--
-- Returns {{now, admitted (0/1), TAT µs, frac of the stored state before
-- the Take}}, or {an error reply} for a malformed spec or a bucket that
-- holds something other than "TAT:Frac". (common.lua and step.lua,
-- prepended, have the helpers, the clock and the arithmetic.)

local key = KEYS[1]
local p, err = parse_spec(ARGV[3])
if not p then
  return {redis.error_reply(err)}
end
-- MGET, not GET: a key of another type counts as a missing key, a full
-- bucket, as in take.lua.
local v = redis.call('MGET', key)[1]
local us, fr = 0, 0
if v then
  us, fr = parse(key, v)
  if not us then
    return {redis.error_reply(fr)}
  end
end
local nus, nfr, allowed = decide_single(p, us, fr, now)
if nus ~= us or nfr ~= fr then
  put(key, nus, nfr, now)
end
return {{now, allowed, us, fr}}
