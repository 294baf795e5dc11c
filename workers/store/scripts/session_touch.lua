-- Record progress of a running run (never moves backwards). KEYS: run. ARGV: now_ms.
-- Returns 1 while the run is running, 0 once it ended (the caller was superseded or aborted).
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return 0
end
local progress = tonumber(redis.call('HGET', KEYS[1], 'progress_ms') or '0')
if progress < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'progress_ms', ARGV[1])
end
return 1
