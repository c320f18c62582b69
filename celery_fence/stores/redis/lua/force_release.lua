-- force_release (admin): give the key a new token and free it, fencing out any holder.
-- KEYS[1] lease hash   KEYS[2] key history   KEYS[3] event counter   KEYS[4] counter
-- KEYS[5] witnessed high token   KEYS[6] leased keys (zset)
-- ARGV[1] key
-- Returns the new token, or nil for an unknown key; FENCE_REWOUND error.
local now, at = clock()
local old = redis.call('HGET', KEYS[1], 'token')
if not old then
  return false
end
local token = next_token(KEYS[4], KEYS[5], tonumber(old))
redis.call('HSET', KEYS[1], 'token', token)
redis.call('HDEL', KEYS[1], 'owner', 'exp')
redis.call('ZREM', KEYS[6], ARGV[1])
log(KEYS[2], KEYS[3], at, ARGV[1], 'admin-release', token, nil)
return token
