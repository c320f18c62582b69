-- renew: extend every lease whose (key, token) is current; never changes a token.
-- KEYS[1] event counter   KEYS[2] counter   KEYS[3] witnessed high token   KEYS[4] leased keys (zset)
-- then for lease i: KEYS[2i+3] its lease hash, KEYS[2i+4] its key history
-- ARGV[1] ttl in ms; then for lease i: ARGV[3i-1] key, ARGV[3i] token, ARGV[3i+1] owner
-- Returns the positions (1-based) of the leases that were lost.
local now, at = clock()
local exp = int(now + tonumber(ARGV[1]))
local lost = {}
for i = 1, (#KEYS - 4) / 2 do
  local key, token = ARGV[3 * i - 1], ARGV[3 * i]
  local current, stored = is_current(KEYS[2 * i + 3], token)
  witness(KEYS[2], KEYS[3], token, stored)
  if current then
    redis.call('HSET', KEYS[2 * i + 3], 'exp', exp)
    redis.call('ZADD', KEYS[4], exp, key)
  else
    lost[#lost + 1] = i
    local h = redis.call('HMGET', KEYS[2 * i + 3], 'token', 'done')
    if not (h[2] == '1' and h[1] == token) then -- its own completion won the race: no failure
      log(KEYS[2 * i + 4], KEYS[1], at, key, 'renew-failed', token, ARGV[3 * i + 1])
    end
  end
end
return lost
