-- prune: drop finished keys (lease hash, steps and history) finished at or before a cutoff.
-- The counter is never touched, so tokens never go back.
-- KEYS[1] finished keys (zset)   KEYS[2] key index; then for key i: KEYS[3i] lease hash, KEYS[3i+1]
-- steps, KEYS[3i+2] history
-- ARGV[1] cutoff in ms; then ARGV[i+1] key i
-- Returns the number of keys dropped.
local dropped = 0
for i = 1, #ARGV - 1 do
  local h = redis.call('HMGET', KEYS[3 * i], 'done', 'fin')
  if h[1] == '1' and tonumber(h[2]) <= tonumber(ARGV[1]) then
    redis.call('DEL', KEYS[3 * i], KEYS[3 * i + 1], KEYS[3 * i + 2])
    redis.call('ZREM', KEYS[1], ARGV[i + 1])
    redis.call('SREM', KEYS[2], ARGV[i + 1])
    dropped = dropped + 1
  end
end
return dropped
