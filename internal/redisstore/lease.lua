-- ratelimitd lease: one call on one lease pool (Store.Acquire, Release and
-- InFlight in lease.go). It mirrors limiter.MemoryLeases (limiter/lease.go,
-- leasePool): a pool is one sorted set, lease id → expiry in Unix
-- microseconds; a lease expiring at t is held before t and not at t. Every
-- call first purges the expired leases and reports how many.
--
-- KEYS[1]  the pool's sorted set
-- KEYS[2]  the pool's waiting mark: present while someone may wait for a
--          slot (set by a denied acquire with a max wait), so that releases
--          publish only then
-- ARGV[1]  now in Unix microseconds, or "" to read the server's TIME
-- ARGV[2]  the operation: "a" acquire, "r" release, "n" read
-- ARGV[3]  the lease id ("a", "r")
-- ARGV[4]  max in flight ("a")
-- ARGV[5]  the lease's duration in µs ("a")
-- ARGV[6]  the max wait in ms, 0 for none ("a")
-- ARGV[7]  the channel a release publishes on ("r")
--
-- Returns {ok, renewed, held, expired, until next expiry µs, now}: ok is 1
-- when an acquire admitted (took or renewed) or a release freed a held
-- lease; held is the number held after the call; until next expiry is, for
-- a denied acquire and a read, the time until the earliest held lease
-- expires (0 when none). A release that frees a lease while the mark is
-- present publishes held on ARGV[7]. (clock.lua, prepended, reads the
-- clock.)

local pool, mark = KEYS[1], KEYS[2]
local op = ARGV[2]
local expired = redis.call('ZREMRANGEBYSCORE', pool, '-inf', string.format('%d', now))

-- the time from now until the earliest expiry, 0 if none is held
local function until_next()
  local first = redis.call('ZRANGE', pool, 0, 0, 'WITHSCORES')
  if first[2] then
    return tonumber(first[2]) - now
  end
  return 0
end

if op == 'a' then
  local id, cap, lease = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
  local held = redis.call('ZCARD', pool)
  -- mirrors leasePool.acquire: a held id renews in its one slot
  local renewed = redis.call('ZSCORE', pool, id) ~= false
  if renewed or held < cap then
    redis.call('ZADD', pool, string.format('%d', now + lease), id)
    if not renewed then
      held = held + 1
    end
    -- The key lives one lease past its latest lease's expiry: an
    -- abandoned pool disappears by itself, and a call in that grace still
    -- finds (and counts) the leases that expired unreleased.
    local gone = tonumber(redis.call('ZRANGE', pool, -1, -1, 'WITHSCORES')[2]) + lease
    if server_clock then
      redis.call('PEXPIREAT', pool, (divmod(gone + 999, 1000)))
    else
      redis.call('PEXPIRE', pool, (divmod(gone - now + 999, 1000)))
    end
    return {1, renewed and 1 or 0, held, expired, 0, now}
  end
  local wait = tonumber(ARGV[6])
  if wait > 0 and redis.call('PTTL', mark) < wait then
    redis.call('SET', mark, '1', 'PX', wait)
  end
  return {0, 0, held, expired, until_next(), now}
elseif op == 'r' then
  local freed = redis.call('ZREM', pool, ARGV[3])
  local held = redis.call('ZCARD', pool)
  if freed == 1 and redis.call('EXISTS', mark) == 1 then
    redis.call('PUBLISH', ARGV[7], held)
  end
  return {freed, 0, held, expired, 0, now}
elseif op == 'n' then
  return {0, 0, redis.call('ZCARD', pool), expired, until_next(), now}
end
return redis.error_reply('ratelimitd: lease operation ' .. tostring(op) .. ': want a, r or n')
