-- due: the members of a time index (key -> store ms) at or before now minus an age, oldest first
-- (the first step of prune, on finished keys, and of abandoned, on leased keys).
-- KEYS[1] the index (zset)
-- ARGV[1] age in ms
-- Returns {cutoff in ms, key, key, ...}.
local now = clock()
local cutoff = int(now - tonumber(ARGV[1]))
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff)
table.insert(due, 1, cutoff)
return due
