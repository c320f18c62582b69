-- recover: claim the re-send of an abandoned run iff the key is unchanged since it was seen (same
-- token and counts: one recoverer wins) and still abandoned (expired, not done, not dead). The copy is
-- counted as sent; the acquire that starts it moves it to 'rec' (only started copies count).
-- KEYS[1] lease hash   KEYS[2] key history; event counter and leased keys from shared()
-- A[1] key   A[2] token seen   A[3] recoveries seen   A[4] max recoveries   A[5] reason
-- A[6] copies sent (not started) seen
-- Returns the attempt number to re-send, 0 if the key was marked dead instead, nil if nothing to do.
local now, at = clock()
local h = redis.call('HMGET', KEYS[1], 'token', 'exp', 'done', 'dead', 'rec', 'owner', 'sent')
local rec, sent = tonumber(h[5] or '0'), tonumber(h[7] or '0')
local changed = h[1] ~= A[2] or rec ~= tonumber(A[3]) or sent ~= tonumber(A[6])
if changed or not h[2] or tonumber(h[2]) > now or h[3] == '1' or h[4] then
  return false
end
local s = shared()
redis.call('HSET', KEYS[1], 'recat', int(now))
if rec >= tonumber(A[4]) then
  local reason = A[5] ~= '' and A[5] or ('gave up after ' .. int(rec) .. ' recoveries')
  mark_dead(KEYS[1], KEYS[2], s.events, s.live, at, A[1], 'dead', A[2], h[6], reason)
  return 0
end
redis.call('HSET', KEYS[1], 'sent', int(sent + 1))
log(KEYS[2], s.events, at, A[1], 'recovered', A[2], h[6], int(rec + 1))
return rec + 1
