-- acquire: take the lease on a key if it is free or expired, with a new token from the counter.
-- KEYS[1] lease hash   KEYS[2] key history   KEYS[3] event counter   KEYS[4] counter
-- KEYS[5] witnessed high token   KEYS[6] leased keys (zset: key -> expiry)   KEYS[7] key index (set)
-- ARGV[1] key   ARGV[2] owner   ARGV[3] ttl in ms   ARGV[4] run (JSON) or ''
-- Returns {'ok', token[, ms the taken-over lease had been expired]} | {'own', token} (our own, retried)
--   | {'held', owner, ms left} | {'done', token, result}; FENCE_REWOUND error.
local now, at = clock()
local h = redis.call('HMGET', KEYS[1], 'token', 'owner', 'exp', 'done', 'result', 'sent')
if h[4] == '1' then
  return {'done', h[1], h[5]}
end
local exp = tonumber(h[3])
if exp and exp > now then
  if h[2] == ARGV[2] then -- our own acquire, retried after a lost reply
    return {'own', h[1]}
  end
  return {'held', h[2], int(exp - now)}
end
local token = next_token(KEYS[4], KEYS[5], tonumber(h[1]) or 0)
local until_ms = int(now + tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'token', token, 'owner', ARGV[2], 'exp', until_ms)
redis.call('HDEL', KEYS[1], 'run', 'dead', 'recat', 'sent') -- the recovery count ('rec') carries over
if tonumber(h[6] or '0') > 0 then -- this acquire starts the pending recovery copy: from now on it counts
  redis.call('HINCRBY', KEYS[1], 'rec', 1)
end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'run', ARGV[4])
end
redis.call('ZADD', KEYS[6], until_ms, ARGV[1])
redis.call('SADD', KEYS[7], ARGV[1])
log(KEYS[2], KEYS[3], at, ARGV[1], exp and 'takeover' or 'acquire', token, ARGV[2])
if exp then
  return {'ok', token, int(now - exp)}
end
return {'ok', token}
