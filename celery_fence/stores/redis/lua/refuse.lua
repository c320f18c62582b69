-- refuse: record that a write of this lease was refused before it reached the store (a refusal proves
-- nothing about the counter: only the event counter of shared() is touched).
-- KEYS[1] key history
-- A[1] key   A[2] token   A[3] owner   A[4] what was refused
local now, at = clock()
log(KEYS[1], shared().events, at, A[1], 'refused', A[2], A[3], A[4])
return 1
