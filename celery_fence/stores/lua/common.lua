-- Helpers shared by the Redis store's scripts: RedisStore prepends this file to each script before
-- loading it, so every operation stays one self-contained EVALSHA. Not a script on its own.
--
-- Tokens and store-clock milliseconds are Lua doubles: exact below 2^53, written with '%d' (tostring
-- would print only 14 significant digits). History lines are JSON objects of strings.

local function int(n)
  return string.format('%d', n)
end

-- The store clock: milliseconds since the epoch (expiry) and seconds with microseconds (history).
local function clock()
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return ms, t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end

-- Append one event to the key's history and to the global history (both lists, oldest first).
local function log(hist, all, at, key, event, token, owner, detail)
  local line = cjson.encode({at = at, event = event, token = token, owner = owner or nil,
                             detail = detail, key = key})
  redis.call('RPUSH', hist, line)
  redis.call('RPUSH', all, line)
end

-- Is token the key's current token: the same token, leased (not released) and not finished? An
-- expired lease that nobody took over is still current. Also returns the stored token (or false).
local function is_current(lease, token)
  local h = redis.call('HMGET', lease, 'token', 'exp', 'done')
  return h[1] == token and h[2] ~= false and h[3] ~= '1', h[1]
end

-- A token that a client presents above the counter proves that the counter went back (a restart
-- without persistence, a failover): remember the highest such token so that none up to it is issued
-- again. Under normal operation every presented token is at most the counter: nothing is written.
local function witness(counter, high, token)
  local t = tonumber(token)
  if t > tonumber(redis.call('GET', counter) or '0') and t > tonumber(redis.call('GET', high) or '0') then
    redis.call('SET', high, int(t))
  end
end

-- The next token from the one counter. Refused (FENCE_REWOUND, nothing written) unless it is above
-- the key's own token (floor), every token witnessed above the counter, and the token of the last
-- event in the global history.
local function next_token(counter, high, all, floor)
  local nxt = tonumber(redis.call('GET', counter) or '0') + 1
  floor = math.max(floor, tonumber(redis.call('GET', high) or '0'))
  local last = redis.call('LINDEX', all, -1)
  if last then
    floor = math.max(floor, tonumber(cjson.decode(last).token))
  end
  if nxt <= floor then
    error(redis.error_reply('FENCE_REWOUND fence token counter rewound: the next token ' .. int(nxt) ..
      ' is not above token ' .. int(floor) .. ', issued before'))
  end
  return int(redis.call('INCR', counter))
end
