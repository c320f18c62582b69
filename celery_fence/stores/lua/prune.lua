-- prune: drop finished keys (lease hash and steps; history stays) finished at or before a cutoff.
-- The counter is never touched, so tokens never go back.
-- KEYS[1] finished keys (zset)   KEYS[2] key index; then for key i: KEYS[2i+1] lease hash, KEYS[2i+2] steps
-- ARGV[1] cutoff in ms; then ARGV[i+1] key i
-- Returns the number of keys dropped.
local dropped = 0
for i = 1, #ARGV - 1 do
  local h = redis.call('HMGET', KEYS[2 * i + 1], 'done', 'fin')
  if h[1] == '1' and tonumber(h[2]) <= tonumber(ARGV[1]) then
    redis.call('DEL', KEYS[2 * i + 1], KEYS[2 * i + 2])
    redis.call('ZREM', KEYS[1], ARGV[i + 1])
    redis.call('SREM', KEYS[2], ARGV[i + 1])
    dropped = dropped + 1
  end
end
return dropped
