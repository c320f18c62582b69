-- Helpers shared by the Redis store's scripts: RedisStore prepends this file to each script before
-- loading it, so every operation stays one self-contained EVALSHA. Not a script on its own.
--
-- Tokens and store-clock milliseconds are Lua doubles: exact below 2^53, written with '%d' (tostring
-- would print only 14 significant digits). Tokens stay in [1, MAX_TOKEN]: the Python side refuses any
-- other, and no script issues one above it. History lines are JSON objects of strings.

-- Every script gets ARGV[1] the store's key prefix and ARGV[2] the slot tag ('' on one server), then its
-- own arguments, read as A[1], A[2], ...: the names every write touches are made here from the prefix,
-- not passed as KEYS on every call. On one server they are store-wide (one token counter, one event
-- counter, the indexes); in a cluster (a tag) nothing is store-wide: each slot has its own token counter
-- and witnessed high token, named with the tag the store found for the slot of the script's keys (so
-- they hash to that slot too), and no index or event counter.

local MAX_TOKEN = 9007199254740991 -- 2^53 - 1
local P, TAG = ARGV[1], ARGV[2]
local A = {}
for i = 3, #ARGV do
  A[i - 2] = ARGV[i]
end

-- The names a write touches beyond its key's own: on one server the store-wide ones; in a cluster its
-- slot's token counter and witnessed high token, nothing else.
local function shared()
  if TAG == '' then
    return {counter = P .. 'counter', high = P .. 'high', events = P .. 'events', live = P .. 'live',
            index = P .. 'keys', done = P .. 'done', pruned = P .. 'pruned'}
  end
  return {counter = P .. 'counter:{' .. TAG .. '}', high = P .. 'high:{' .. TAG .. '}'}
end

-- Index writes: a cluster keeps no index (its listings scan every primary), so these do nothing there.
local function zadd(index, score, member)
  if index then
    redis.call('ZADD', index, score, member)
  end
end

local function zrem(index, member)
  if index then
    redis.call('ZREM', index, member)
  end
end

local function int(n)
  return string.format('%d', n)
end

-- The store clock: milliseconds since the epoch (expiry) and seconds with microseconds (history).
local function clock()
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return ms, t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end

-- Append one event to the key's history (a list, oldest first), numbered by the store-wide event
-- counter so that every key's history reads back in one order (in a cluster, no counter: n is 0 and the
-- lists are merged by time). No global list: prune drops a key's history with the key, and nothing else
-- grows.
local function log(hist, events, at, key, event, token, owner, detail)
  local n = events and int(redis.call('INCR', events)) or '0'
  redis.call('RPUSH', hist, cjson.encode({at = at, event = event, token = token, owner = owner or nil,
                                          detail = detail, key = key, n = n}))
end

-- Mark the key dead with reason, logged as event ('dead': recovery gave up; 'gave-up': a run gave up
-- before it acquired): no longer a candidate for recovery until it is leased again.
local function mark_dead(lease, hist, events, live, at, key, event, token, owner, reason)
  redis.call('HSET', lease, 'dead', reason)
  zrem(live, key)
  log(hist, events, at, key, event, token, owner, reason)
end

-- Is token the key's current token: the same token, leased (not released) and not finished? An
-- expired lease that nobody took over is still current. Also returns the stored token (or false).
local function is_current(lease, token)
  local h = redis.call('HMGET', lease, 'token', 'exp', 'done')
  return h[1] == token and h[2] ~= false and h[3] ~= '1', h[1]
end

-- A key whose stored token is above the counter proves that the counter went back (an evicted counter,
-- a failover): remember it so that no token up to it is issued again. Only the store's own record counts
-- (stored, the key's token in its lease hash): a token a client merely presents may be forged, and one
-- forged token must never raise the floor (every later acquire would be refused).
local function witness(counter, high, token, stored)
  local t = tonumber(token)
  if stored ~= token or t > MAX_TOKEN then
    return
  end
  if t > tonumber(redis.call('GET', counter) or '0') and t > tonumber(redis.call('GET', high) or '0') then
    redis.call('SET', high, int(t))
  end
end

-- The next token from the counter of shared() (s): the store's, or in a cluster the slot's. Refused
-- (FENCE_REWOUND, nothing written) unless it is above the key's own token (floor) and the highest token
-- issued or witnessed (kept apart from the counter, so an evicted or set-back counter is caught on every
-- key); FENCE_RANGE past MAX_TOKEN.
local function next_token(s, floor)
  local nxt = tonumber(redis.call('GET', s.counter) or '0') + 1
  floor = math.max(floor, tonumber(redis.call('GET', s.high) or '0'))
  if nxt <= floor then
    error(redis.error_reply('FENCE_REWOUND fence token counter rewound: the next token ' .. int(nxt) ..
      ' is not above token ' .. int(floor) .. ', issued before'))
  end
  if nxt > MAX_TOKEN then
    error(redis.error_reply('FENCE_RANGE the token counter reached 2^53 - 1'))
  end
  local token = int(redis.call('INCR', s.counter))
  redis.call('SET', s.high, token)
  return token
end
