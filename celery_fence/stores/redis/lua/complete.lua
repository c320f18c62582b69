-- complete: store the result, mark the key done and release the lease, iff the token is current.
-- KEYS[1] lease hash   KEYS[2] key history   KEYS[3] event counter   KEYS[4] counter
-- KEYS[5] witnessed high token   KEYS[6] leased keys (zset)   KEYS[7] finished keys (zset: key -> ms)
-- ARGV[1] key   ARGV[2] token   ARGV[3] owner   ARGV[4] result (JSON)
-- Returns {'ok'} | {'stale', current token or nil} (the refusal is recorded).
local now, at = clock()
local current, token = is_current(KEYS[1], ARGV[2])
witness(KEYS[4], KEYS[5], ARGV[2], token)
if not current then
  log(KEYS[2], KEYS[3], at, ARGV[1], 'refused', ARGV[2], ARGV[3], 'complete')
  return {'stale', token}
end
redis.call('HSET', KEYS[1], 'done', '1', 'result', ARGV[4], 'fin', int(now))
redis.call('HDEL', KEYS[1], 'exp')
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('ZADD', KEYS[7], int(now), ARGV[1])
log(KEYS[2], KEYS[3], at, ARGV[1], 'complete', ARGV[2], ARGV[3])
return {'ok'}
