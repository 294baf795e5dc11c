-- A tool's progress report. KEYS: call, run. ARGV: now_ms, progress_json.
-- Ignored once the call record is gone (expired): a heartbeat never recreates it.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'hb_ms', ARGV[1], 'progress', ARGV[2])
touch_run(KEYS[2], ARGV[1], 0, 0)
return 1
