-- strand: a run of the key gave up before it acquired (it waited out an unavailable store). Iff the key
-- is free (new, or neither finished nor leased: an expired lease is recovery's), mark it dead with the
-- reason, keep the run's record and the key's token ('0' for a new key: none is issued), drop the owner.
-- KEYS[1] lease hash   KEYS[2] key history; event counter, leased keys and key index from shared()
-- A[1] key   A[2] run (JSON) or ''   A[3] reason
-- Returns 1 if the key was marked, 0 if it was left alone.
local _, at = clock()
local h = redis.call('HMGET', KEYS[1], 'token', 'exp', 'done')
if h[2] or h[3] == '1' then
  return 0
end
local s = shared()
local token = h[1] or '0'
redis.call('HSET', KEYS[1], 'token', token)
redis.call('HDEL', KEYS[1], 'owner', 'run')
if A[2] ~= '' then
  redis.call('HSET', KEYS[1], 'run', A[2])
end
if s.index then
  redis.call('SADD', s.index, A[1]) -- listed by leases()
end
mark_dead(KEYS[1], KEYS[2], s.events, s.live, at, A[1], 'gave-up', token, nil, A[3])
return 1
