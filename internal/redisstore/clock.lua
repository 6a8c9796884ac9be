-- ratelimitd: what every script of this package starts with (store.go
-- prepends it): the clock. ARGV[1] is now in Unix microseconds, or "" to
-- read the server's TIME (then server_clock is true). Top-level
-- statements only, no functions: take_one.lua, which has no helpers, starts
-- with it too.

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
