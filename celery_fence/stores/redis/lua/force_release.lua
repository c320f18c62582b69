-- force_release (admin): give the key a new token and free it, fencing out any holder.
-- KEYS[1] lease hash   KEYS[2] key history; counter, high token, event counter and leased keys from shared()
-- A[1] key
-- Returns the new token, or nil for an unknown key; FENCE_REWOUND error.
local now, at = clock()
local old = redis.call('HGET', KEYS[1], 'token')
if not old then
  return false
end
local s = shared()
local token = next_token(s, tonumber(old))
redis.call('HSET', KEYS[1], 'token', token)
redis.call('HDEL', KEYS[1], 'owner', 'exp')
zrem(s.live, A[1])
log(KEYS[2], s.events, at, A[1], 'admin-release', token, nil)
return token
