-- strand: a run of the key gave up before it acquired (it waited out an unavailable store). Iff the key
-- is free (new, or neither finished nor leased: an expired lease is recovery's), mark it dead with the
-- reason, keep the run's record and the key's token ('0' for a new key: none is issued), drop the owner.
-- KEYS[1] lease hash   KEYS[2] key history   KEYS[3] event counter   KEYS[4] counter
-- KEYS[5] witnessed high token   KEYS[6] leased keys (zset)   KEYS[7] key index (set)
-- ARGV[1] key   ARGV[2] run (JSON) or ''   ARGV[3] reason
-- Returns 1 if the key was marked, 0 if it was left alone.
local _, at = clock()
local h = redis.call('HMGET', KEYS[1], 'token', 'exp', 'done')
if h[2] or h[3] == '1' then
  return 0
end
local token = h[1] or '0'
redis.call('HSET', KEYS[1], 'token', token)
redis.call('HDEL', KEYS[1], 'owner', 'run')
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'run', ARGV[2])
end
redis.call('SADD', KEYS[7], ARGV[1]) -- listed by leases()
mark_dead(KEYS[1], KEYS[2], KEYS[3], KEYS[6], at, ARGV[1], 'gave-up', token, nil, ARGV[3])
return 1
