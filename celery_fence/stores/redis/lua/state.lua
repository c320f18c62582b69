-- state: read lease hashes with the store clock (for get and leases).
-- KEYS[i] lease hash of key i
-- A: none
-- Returns {now in ms, then per key: {token, owner, exp, done, result, dead, rec, sent, run} or nil if unknown}.
local now = clock()
local out = {int(now)}
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    out[i + 1] = redis.call('HMGET', KEYS[i], 'token', 'owner', 'exp', 'done', 'result', 'dead', 'rec', 'sent', 'run')
  else
    out[i + 1] = false
  end
end
return out
