-- due: the members of time indexes (key -> store ms) at or before now minus an age, oldest first
-- (the first step of prune, on finished keys and on markers, and of abandoned, on leased keys; one
-- server only: a cluster keeps no index).
-- A[1] age in ms; A[2], A[3], ... the indexes (zsets), by name after the prefix
-- Returns {cutoff in ms, {members of the first index}, {members of the second}, ...}.
local now = clock()
local cutoff = int(now - tonumber(A[1]))
local reply = {cutoff}
for i = 2, #A do
  reply[i] = redis.call('ZRANGEBYSCORE', P .. A[i], '-inf', cutoff)
end
return reply
