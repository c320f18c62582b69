-- abandoned: of the given keys, those whose lease expired at or before a cutoff without completion,
-- not dead and not recovered within the backoff (the second step of abandoned, after due).
-- KEYS[i] lease hash of key i
-- ARGV[1] cutoff in store ms (now - grace); ARGV[2] grace in ms; ARGV[i+2] key i
-- Returns {{key, token, run or nil, recoveries, copies sent not started}, ...} in the order given.
local found = {}
local cutoff, grace = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 1, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'token', 'exp', 'done', 'dead', 'run', 'rec', 'recat', 'sent')
  local sent = tonumber(h[8] or '0')
  local backoff = sent <= 1 and 1 or math.min(2 ^ (sent - 1), 32) -- lease.recovery_backoff
  local quiet = tonumber(h[7] or '0') <= cutoff + grace - grace * backoff
  if h[2] and tonumber(h[2]) <= cutoff and h[3] ~= '1' and not h[4] and quiet then
    found[#found + 1] = {ARGV[i + 2], h[1], h[5], h[6] or '0', int(sent)}
  end
end
return found
