-- A worker claims a call before running its tool. KEYS: call, lease, run.
-- ARGV: now_ms, worker_id, lease_ttl_ms, ttl_s.
-- Returns {status, attempt}: 'done' (answered: never run again), 'busy' (another live worker
-- holds the lease), or 'claimed' (run it; the lease is ours).
-- One read of the call: state 'done' is written with the result, in the same HSET
-- (ledger_finish.lua), and no script changes the state of an answered call, so it stands for
-- "has a result" without fetching the result. Fields a claim must also check go at the end
-- of this HMGET.
local call = redis.call('HMGET', KEYS[1], 'state', 'attempt')
local state, attempt = call[1], tonumber(call[2] or '0')
if state == 'done' then
  return {'done', attempt}
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'busy', attempt}
end
local taken_over = state == 'running' -- its lease lapsed
attempt = attempt + 1
redis.call('HSET', KEYS[1], 'state', 'running', 'started_ms', ARGV[1], 'hb_ms', ARGV[1],
           'worker', ARGV[2], 'attempt', attempt)
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
touch_run(KEYS[3], ARGV[1], 0, taken_over and 0 or 1)
return {'claimed', attempt}
