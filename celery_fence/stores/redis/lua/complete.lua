-- complete: store the result, mark the key done and release the lease, iff the token is current.
-- KEYS[1] lease hash   KEYS[2] key history; counter, high token, event counter, leased keys and finished
-- keys (zset: key -> ms) from shared()
-- A[1] key   A[2] token   A[3] owner   A[4] result (JSON)
-- Returns {'ok'} | {'stale', current token or nil} (the refusal is recorded).
local now, at = clock()
local s = shared()
local current, token = is_current(KEYS[1], A[2])
witness(s.counter, s.high, A[2], token)
if not current then
  log(KEYS[2], s.events, at, A[1], 'refused', A[2], A[3], 'complete')
  return {'stale', token}
end
redis.call('HSET', KEYS[1], 'done', '1', 'result', A[4], 'fin', int(now))
redis.call('HDEL', KEYS[1], 'exp')
zrem(s.live, A[1])
zadd(s.done, int(now), A[1])
log(KEYS[2], s.events, at, A[1], 'complete', A[2], A[3])
return {'ok'}
