-- abandoned: of the given keys, those whose lease expired at or before a cutoff without completion,
-- not dead and not recovered within the backoff (the second step of abandoned, after due or a scan).
-- KEYS[i] lease hash of key i
-- A[1] cutoff in store ms (now - grace; '': now here - grace, in a cluster); A[2] grace in ms; A[i+2] key i
-- Returns {{key, token, run or nil, recoveries, copies sent not started}, ...} in the order given.
local found = {}
local grace = tonumber(A[2])
local cutoff = A[1] == '' and clock() - grace or tonumber(A[1])
for i = 1, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'token', 'exp', 'done', 'dead', 'run', 'rec', 'recat', 'sent')
  local sent = tonumber(h[8] or '0')
  local backoff = sent <= 1 and 1 or math.min(2 ^ (sent - 1), 32) -- lease.recovery_backoff
  local quiet = tonumber(h[7] or '0') <= cutoff + grace - grace * backoff
  if h[2] and tonumber(h[2]) <= cutoff and h[3] ~= '1' and not h[4] and quiet then
    found[#found + 1] = {A[i + 2], h[1], h[5], h[6] or '0', int(sent)}
  end
end
return found
