-- prune: drop finished keys (lease hash, steps and history) finished at or before a cutoff, each leaving
-- one 'pruned' marker (its last token, no owner) as its history; before that, drop the markers of earlier
-- prunes written at or before the cutoff (a marker is its key's first history line), so they stay bounded.
-- The counter is never touched, so tokens never go back (in a cluster, the slot's).
-- KEYS: for marked key j, KEYS[j] its history; then for finished key i: lease hash, steps, history
-- (the finished keys, the marker index, the key index and the event counter come from shared()).
-- A[1] cutoff in ms ('': now here, in a cluster)   A[2] age in ms   A[3] m, the number of marked keys;
-- then the m marked keys, then the finished ones. A marker is past the cutoff by its index (one server)
-- or by its own time (a cluster, which keeps no index).
-- Returns the number of keys dropped.
local now, at = clock()
local s = shared()
local cutoff, m = A[1] == '' and now - tonumber(A[2]) or tonumber(A[1]), tonumber(A[3])
for j = 1, m do
  local key = A[3 + j]
  local first = redis.call('LINDEX', KEYS[j], 0)
  local line = first and cjson.decode(first)
  local marked = s.pruned and tonumber(redis.call('ZSCORE', s.pruned, key))
  if not s.pruned and line and line.event == 'pruned' then
    marked = tonumber(line.at) * 1000
  end
  if marked and marked <= cutoff then
    if line and line.event == 'pruned' then
      redis.call('LPOP', KEYS[j])
    end
    zrem(s.pruned, key)
  end
end
local dropped = 0
for i = 1, #A - 3 - m do
  local key, k = A[3 + m + i], m + 3 * (i - 1)
  local h = redis.call('HMGET', KEYS[k + 1], 'done', 'fin', 'token')
  if h[1] == '1' and tonumber(h[2]) <= cutoff then
    redis.call('DEL', KEYS[k + 1], KEYS[k + 2], KEYS[k + 3])
    zrem(s.done, key)
    if s.index then
      redis.call('SREM', s.index, key)
    end
    log(KEYS[k + 3], s.events, at, key, 'pruned', h[3])
    zadd(s.pruned, int(now), key)
    dropped = dropped + 1
  end
end
return dropped
