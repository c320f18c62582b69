-- refuse: record that a write of this lease was refused before it reached the store.
-- KEYS[1] key history   KEYS[2] event counter   KEYS[3] counter (unused)   KEYS[4] witnessed high token
-- (unused: a refusal proves nothing about the counter)   KEYS[5] leased keys (zset, unused)
-- ARGV[1] key   ARGV[2] token   ARGV[3] owner   ARGV[4] what was refused
local now, at = clock()
log(KEYS[1], KEYS[2], at, ARGV[1], 'refused', ARGV[2], ARGV[3], ARGV[4])
return 1
