-- prune_due: the keys finished more than a given age ago, by the store clock (first step of prune).
-- KEYS[1] finished keys (zset: key -> finish time in ms)
-- ARGV[1] age in ms
-- Returns {cutoff in ms, key, key, ...}.
local now = clock()
local cutoff = int(now - tonumber(ARGV[1]))
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff)
table.insert(due, 1, cutoff)
return due
