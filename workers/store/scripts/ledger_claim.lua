-- A worker claims a call before running its tool. KEYS: call, lease, run.
-- ARGV: now_ms, worker_id, lease_ttl_ms, ttl_s.
-- Returns {status, attempt}: 'done' (answered: never run again), 'busy' (another live worker
-- holds the lease), or 'claimed' (run it; the lease is ours).
if redis.call('HEXISTS', KEYS[1], 'result') == 1 then
  return {'done', tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0')}
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'busy', tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0')}
end
local taken_over = redis.call('HGET', KEYS[1], 'state') == 'running' -- its lease lapsed
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
redis.call('HSET', KEYS[1], 'state', 'running', 'started_ms', ARGV[1], 'hb_ms', ARGV[1], 'worker', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
touch_run(KEYS[3], ARGV[1], 0, taken_over and 0 or 1)
return {'claimed', attempt}
