-- The agent itself is alive (a model turn streaming, thinking): record it on a running run.
-- KEYS[1] run   ARGV[1] now_ms   ARGV[2] what (short label)   ARGV[3] idle: "1" when a stream
-- went idle past its timeout (counted, not progress), "0" for a heartbeat.
-- Returns 1 while the run is running, 0 once it ended or does not exist.
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return 0
end
if ARGV[3] == '1' then
  redis.call('HINCRBY', KEYS[1], 'stream_idle_n', 1)
  redis.call('HSET', KEYS[1], 'stream_idle_ms', ARGV[1])
  return 1
end
local progress = tonumber(redis.call('HGET', KEYS[1], 'progress_ms') or '0')
if progress < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'progress_ms', ARGV[1])
end
redis.call('HSET', KEYS[1], 'agent_beat_ms', ARGV[1], 'agent_beat_what', ARGV[2])
return 1
