-- release: give the lease back iff the token is current; a stale release changes nothing.
-- KEYS[1] lease hash   KEYS[2] key history   KEYS[3] event counter   KEYS[4] counter
-- KEYS[5] witnessed high token   KEYS[6] leased keys (zset)
-- ARGV[1] key   ARGV[2] token   ARGV[3] owner
-- Returns 1 if released, 0 if the token was stale.
local now, at = clock()
local current, token = is_current(KEYS[1], ARGV[2])
witness(KEYS[4], KEYS[5], ARGV[2], token)
if not current then
  return 0
end
redis.call('HDEL', KEYS[1], 'exp')
redis.call('ZREM', KEYS[6], ARGV[1])
log(KEYS[2], KEYS[3], at, ARGV[1], 'release', ARGV[2], ARGV[3])
return 1
