-- save_step: commit checkpoint (key, name) = value iff the token is current, once per name.
-- KEYS[1] lease hash   KEYS[2] steps hash   KEYS[3] key history; counter, high token and event counter
-- from shared()
-- A[1] key   A[2] token   A[3] owner   A[4] step name   A[5] value (JSON)
-- Returns {'ok'} | {'dup'} | {'stale', current token or nil} (the refusal is recorded).
-- A step is stored as '<commit order>\n<value>' so that steps() lists them in commit order.
local now, at = clock()
local s = shared()
local current, token = is_current(KEYS[1], A[2])
witness(s.counter, s.high, A[2], token)
if not current then
  log(KEYS[3], s.events, at, A[1], 'refused', A[2], A[3], 'step ' .. A[4])
  return {'stale', token}
end
if redis.call('HEXISTS', KEYS[2], A[4]) == 1 then
  return {'dup'}
end
redis.call('HSET', KEYS[2], A[4], int(redis.call('HLEN', KEYS[2])) .. '\n' .. A[5])
log(KEYS[3], s.events, at, A[1], 'step', A[2], A[3], A[4])
return {'ok'}
