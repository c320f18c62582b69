-- advance: move the counter forward by a gap (after a failover or restore), unless the counter would
-- then leave [1, MAX_TOKEN]: nothing changes and false is returned.
-- KEYS[1] counter
-- ARGV[1] gap (at most MAX_TOKEN: a sum above MAX_TOKEN cannot round down to it)
-- Returns the new counter, or false.
if tonumber(redis.call('GET', KEYS[1]) or '0') + tonumber(ARGV[1]) > MAX_TOKEN then
  return false
end
return redis.call('INCRBY', KEYS[1], ARGV[1])
