-- refuse: record that a write of this lease was refused before it reached the store.
-- KEYS[1] key history   KEYS[2] global history   KEYS[3] counter   KEYS[4] witnessed high token
-- KEYS[5] leased keys (zset, unused)
-- ARGV[1] key   ARGV[2] token   ARGV[3] owner   ARGV[4] what was refused
local now, at = clock()
witness(KEYS[3], KEYS[4], ARGV[2])
log(KEYS[1], KEYS[2], at, ARGV[1], 'refused', ARGV[2], ARGV[3], ARGV[4])
return 1
