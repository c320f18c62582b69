-- abandoned: of the given keys, those whose lease expired at or before a cutoff without completion,
-- not dead and not recovered after the cutoff (the second step of abandoned, after due).
-- KEYS[i] lease hash of key i
-- ARGV[1] cutoff in store ms; ARGV[i+1] key i
-- Returns {{key, token, run or nil, recoveries}, ...} in the order given.
local found = {}
for i = 1, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'token', 'exp', 'done', 'dead', 'run', 'rec', 'recat')
  local cutoff = tonumber(ARGV[1])
  if h[2] and tonumber(h[2]) <= cutoff and h[3] ~= '1' and not h[4] and tonumber(h[7] or '0') <= cutoff then
    found[#found + 1] = {ARGV[i + 1], h[1], h[5], h[6] or '0'}
  end
end
return found
