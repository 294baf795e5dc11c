-- Arm (or re-arm) the post-compaction guard of a run: a fresh window of ARGV[1] outcomes.
--
-- KEYS[1]  run HASH (fields guard_remaining, guard_window)
-- ARGV[1]  window size    ARGV[2] ttl in seconds    ARGV[3] now in ms (stored as guard_armed_ms)
local run, ttl = KEYS[1], tonumber(ARGV[2])
redis.call('HSET', run, 'guard_remaining', ARGV[1], 'guard_window', '', 'guard_armed_ms', ARGV[3])
if redis.call('TTL', run) < ttl then
  redis.call('EXPIRE', run, ttl)
end
return 1
