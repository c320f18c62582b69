-- acquire: take the lease on a key if it is free or expired, with a new token from the counter.
-- KEYS[1] lease hash   KEYS[2] key history; the counter, high token, event counter, leased keys (zset:
-- key -> expiry) and key index (set) come from shared()
-- A[1] key   A[2] owner   A[3] ttl in ms   A[4] run (JSON) or ''
-- Returns {'ok', token[, ms the taken-over lease had been expired]} | {'own', token} (our own, retried)
--   | {'held', owner, ms left} | {'done', token, result}; FENCE_REWOUND error.
local now, at = clock()
local h = redis.call('HMGET', KEYS[1], 'token', 'owner', 'exp', 'done', 'result', 'sent')
if h[4] == '1' then
  return {'done', h[1], h[5]}
end
local exp = tonumber(h[3])
if exp and exp > now then
  if h[2] == A[2] then -- our own acquire, retried after a lost reply
    return {'own', h[1]}
  end
  return {'held', h[2], int(exp - now)}
end
local s = shared()
local token = next_token(s, tonumber(h[1]) or 0)
local until_ms = int(now + tonumber(A[3]))
redis.call('HSET', KEYS[1], 'token', token, 'owner', A[2], 'exp', until_ms)
redis.call('HDEL', KEYS[1], 'run', 'dead', 'recat', 'sent') -- the recovery count ('rec') carries over
if tonumber(h[6] or '0') > 0 then -- this acquire starts the pending recovery copy: from now on it counts
  redis.call('HINCRBY', KEYS[1], 'rec', 1)
end
if A[4] ~= '' then
  redis.call('HSET', KEYS[1], 'run', A[4])
end
zadd(s.live, until_ms, A[1])
if s.index then
  redis.call('SADD', s.index, A[1])
end
log(KEYS[2], s.events, at, A[1], exp and 'takeover' or 'acquire', token, A[2])
if exp then
  return {'ok', token, int(now - exp)}
end
return {'ok', token}
