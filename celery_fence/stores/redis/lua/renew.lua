-- renew: extend every lease whose (key, token) is current; never changes a token.
-- KEYS[2i-1] lease hash of lease i, KEYS[2i] its key history (in a cluster, all in one slot);
-- counter, high token, event counter and leased keys from shared()
-- A[1] ttl in ms; then for lease i: A[3i-1] key, A[3i] token, A[3i+1] owner
-- Returns the positions (1-based) of the leases that were lost.
local now, at = clock()
local exp = int(now + tonumber(A[1]))
local lost = {}
local s = shared()
for i = 1, #KEYS / 2 do
  local key, token = A[3 * i - 1], A[3 * i]
  local current, stored = is_current(KEYS[2 * i - 1], token)
  witness(s.counter, s.high, token, stored)
  if current then
    redis.call('HSET', KEYS[2 * i - 1], 'exp', exp)
    zadd(s.live, exp, key)
  else
    lost[#lost + 1] = i
    local h = redis.call('HMGET', KEYS[2 * i - 1], 'token', 'done')
    if not (h[2] == '1' and h[1] == token) then -- its own completion won the race: no failure
      log(KEYS[2 * i], s.events, at, key, 'renew-failed', token, A[3 * i + 1])
    end
  end
end
return lost
