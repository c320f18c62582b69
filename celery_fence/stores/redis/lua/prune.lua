-- prune: drop finished keys (lease hash, steps and history) finished at or before a cutoff, each leaving
-- one 'pruned' marker (its last token, no owner) as its history; before that, drop the markers of earlier
-- prunes written at or before the cutoff (a marker is its key's first history line), so they stay bounded.
-- The counter is never touched, so tokens never go back.
-- KEYS[1] finished keys (zset)   KEYS[2] key index   KEYS[3] pruned keys (zset: key -> marker ms)
-- KEYS[4] event counter; then for marked key j: KEYS[4+j] history; then for finished key i: lease hash,
-- steps, history
-- ARGV[1] cutoff in ms   ARGV[2] m, the number of marked keys; then the m marked keys, then the finished
-- Returns the number of keys dropped.
local now, at = clock()
local cutoff, m = tonumber(ARGV[1]), tonumber(ARGV[2])
for j = 1, m do
  local marked = tonumber(redis.call('ZSCORE', KEYS[3], ARGV[2 + j]))
  if marked and marked <= cutoff then
    local first = redis.call('LINDEX', KEYS[4 + j], 0)
    if first and cjson.decode(first).event == 'pruned' then
      redis.call('LPOP', KEYS[4 + j])
    end
    redis.call('ZREM', KEYS[3], ARGV[2 + j])
  end
end
local dropped = 0
for i = 1, #ARGV - 2 - m do
  local key, k = ARGV[2 + m + i], 4 + m + 3 * (i - 1)
  local h = redis.call('HMGET', KEYS[k + 1], 'done', 'fin', 'token')
  if h[1] == '1' and tonumber(h[2]) <= cutoff then
    redis.call('DEL', KEYS[k + 1], KEYS[k + 2], KEYS[k + 3])
    redis.call('ZREM', KEYS[1], key)
    redis.call('SREM', KEYS[2], key)
    log(KEYS[k + 3], KEYS[4], at, key, 'pruned', h[3])
    redis.call('ZADD', KEYS[3], int(now), key)
    dropped = dropped + 1
  end
end
return dropped
