-- Hand a lost idempotent call back to the queue. KEYS: call, lease, run. ARGV: expected_attempt, now_ms.
-- Succeeds only if it is still unanswered, still running that attempt, and its lease is gone.
if redis.call('HEXISTS', KEYS[1], 'result') == 1 or redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
if redis.call('HGET', KEYS[1], 'state') ~= 'running' or redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then
  return 0
end
local counted = redis.call('HGET', KEYS[1], 'counted') == '1' -- in claimed_n (ledger_count_claim.lua)
redis.call('HSET', KEYS[1], 'state', 'pending', 'queued_ms', ARGV[2], 'counted', '0')
if counted then
  touch_run(KEYS[3], nil, 0, -1)
end
redis.call('HINCRBY', KEYS[1], 'requeues', 1)
return 1
