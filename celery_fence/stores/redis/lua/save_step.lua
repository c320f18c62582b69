-- save_step: commit checkpoint (key, name) = value iff the token is current, once per name.
-- KEYS[1] lease hash   KEYS[2] steps hash   KEYS[3] key history   KEYS[4] event counter
-- KEYS[5] counter   KEYS[6] witnessed high token   KEYS[7] leased keys (zset, unused)
-- ARGV[1] key   ARGV[2] token   ARGV[3] owner   ARGV[4] step name   ARGV[5] value (JSON)
-- Returns {'ok'} | {'dup'} | {'stale', current token or nil} (the refusal is recorded).
-- A step is stored as '<commit order>\n<value>' so that steps() lists them in commit order.
local now, at = clock()
local current, token = is_current(KEYS[1], ARGV[2])
witness(KEYS[5], KEYS[6], ARGV[2], token)
if not current then
  log(KEYS[3], KEYS[4], at, ARGV[1], 'refused', ARGV[2], ARGV[3], 'step ' .. ARGV[4])
  return {'stale', token}
end
if redis.call('HEXISTS', KEYS[2], ARGV[4]) == 1 then
  return {'dup'}
end
redis.call('HSET', KEYS[2], ARGV[4], int(redis.call('HLEN', KEYS[2])) .. '\n' .. ARGV[5])
log(KEYS[3], KEYS[4], at, ARGV[1], 'step', ARGV[2], ARGV[3], ARGV[4])
return {'ok'}
