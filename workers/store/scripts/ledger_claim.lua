-- A worker claims a call before running its tool. KEYS: call, lease, run.
-- ARGV: now_ms, worker_id, lease_ttl_ms, ttl_s, tool, job_digest (of the message received).
-- Returns {status, attempt, registered tool}: 'done' (answered: never run again),
-- 'unregistered' (no gateway registered this call: run nothing, nothing to answer),
-- 'mismatch' (the message is not the job registered: run nothing, answer the call),
-- 'mismatch_held' (likewise, but a live worker runs the registered job: leave it be),
-- 'busy' (another live worker holds the lease), or 'claimed' (run it; the lease is ours).
if redis.call('HEXISTS', KEYS[1], 'result') == 1 then
  return {'done', tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0'), ''}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'unregistered', 0, ''} -- never create the record: only a registration does
end
local registered = redis.call('HMGET', KEYS[1], 'tool', 'job_digest', 'attempt')
local tool, attempt_now = registered[1] or '', tonumber(registered[3] or '0') or 0
if tool ~= ARGV[5] or (registered[2] or '') ~= ARGV[6] then
  local held = redis.call('EXISTS', KEYS[2]) == 1
  return {held and 'mismatch_held' or 'mismatch', attempt_now, tool}
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'busy', attempt_now, tool}
end
local taken_over = redis.call('HGET', KEYS[1], 'state') == 'running' -- its lease lapsed
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
redis.call('HSET', KEYS[1], 'state', 'running', 'started_ms', ARGV[1], 'hb_ms', ARGV[1], 'worker', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
touch_run(KEYS[3], ARGV[1], 0, taken_over and 0 or 1)
return {'claimed', attempt, tool}
