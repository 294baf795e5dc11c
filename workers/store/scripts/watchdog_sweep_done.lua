-- A sweep completed: record when, and the gap since the previous completed sweep.
-- KEYS[1] P:{runs}:watchdog   ARGV[1] now_ms   ARGV[2] ttl_ms
-- Returns the gap in ms (-1 for the first sweep this key has seen).
local previous = tonumber(redis.call('HGET', KEYS[1], 'last_sweep_ms') or '')
local now = tonumber(ARGV[1])
local gap = -1
if previous then
  gap = math.max(0, now - previous)
  local worst = tonumber(redis.call('HGET', KEYS[1], 'max_gap_ms') or '0') or 0
  if gap > worst then
    redis.call('HSET', KEYS[1], 'max_gap_ms', gap)
  end
end
redis.call('HSET', KEYS[1], 'last_sweep_ms', now, 'last_gap_ms', gap)
redis.call('HINCRBY', KEYS[1], 'sweeps', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return gap
