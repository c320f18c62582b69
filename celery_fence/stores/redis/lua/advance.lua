-- advance: move the counter forward by a gap (after a failover or restore), unless the counter would
-- then leave [1, MAX_TOKEN]: nothing changes and false is returned. On one server: the store-wide counter,
-- by the gap. In a cluster: the slot's counter to at least A[2] (the highest counter of every slot found
-- before, plus the gap), so that every token issued after an advance is above what it returned.
-- A[1] gap (at most MAX_TOKEN: a sum above MAX_TOKEN cannot round down to it)   A[2] the cluster's target
-- Returns the new counter, or false.
local counter = shared().counter
local now = tonumber(redis.call('GET', counter) or '0')
if now + tonumber(A[1]) > MAX_TOKEN then
  return false
end
if TAG == '' then
  return redis.call('INCRBY', counter, A[1])
end
local target = math.max(now + tonumber(A[1]), tonumber(A[2]))
redis.call('SET', counter, int(target))
return target
