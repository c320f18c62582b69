-- due: the members of time indexes (key -> store ms) at or before now minus an age, oldest first
-- (the first step of prune, on finished keys and on markers, and of abandoned, on leased keys).
-- KEYS[1], KEYS[2], ... the indexes (zsets)
-- ARGV[1] age in ms
-- Returns {cutoff in ms, {members of KEYS[1]}, {members of KEYS[2]}, ...}.
local now = clock()
local cutoff = int(now - tonumber(ARGV[1]))
local reply = {cutoff}
for i = 1, #KEYS do
  reply[i + 1] = redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', cutoff)
end
return reply
