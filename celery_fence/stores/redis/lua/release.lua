-- release: give the lease back iff the token is current; a stale release changes nothing.
-- KEYS[1] lease hash   KEYS[2] key history; counter, high token, event counter and leased keys from shared()
-- A[1] key   A[2] token   A[3] owner
-- Returns 1 if released, 0 if the token was stale.
local now, at = clock()
local s = shared()
local current, token = is_current(KEYS[1], A[2])
witness(s.counter, s.high, A[2], token)
if not current then
  return 0
end
redis.call('HDEL', KEYS[1], 'exp')
zrem(s.live, A[1])
log(KEYS[2], s.events, at, A[1], 'release', A[2], A[3])
return 1
