-- Write back an answer that was handed on while no replica held it, after a failover lost it.
-- KEYS: call, calls, restored counter, conflict counter, run.
-- ARGV: call_id, result_json, reason, delivered_ms, ttl_s, writer.
-- Returns 0 when the ledger holds that answer already, 1 when it was written back, -1 when the
-- ledger holds another answer decided before this one was handed on (never overwritten).
-- An answer the ledger holds that was decided *after* the delivery was decided on a primary
-- that had lost the delivered one (the watchdog's deadline_exceeded, a newer run's
-- cancellation, a second execution's result): the delivered answer replaces it, so the
-- ledger ends holding what the agent was handed (docs/failover.md, "Kept until a replica
-- holds it").
local call = redis.call('HMGET', KEYS[1], 'state', 'result', 'finished_ms', 'counted')
local ttl = tonumber(ARGV[5])
if call[2] == ARGV[2] then
  return 0
end
if call[2] and (tonumber(call[3] or '0') or 0) <= tonumber(ARGV[4]) then
  redis.call('INCR', KEYS[4])
  redis.call('EXPIRE', KEYS[4], ttl)
  return -1
end
redis.call('HSET', KEYS[1], 'call_id', ARGV[1], 'state', 'done', 'result', ARGV[2], 'reason', ARGV[3],
           'finished_ms', ARGV[4], 'writer', ARGV[6])
if call[1] and not call[2] then
  -- An open call (its registration survived, its answer did not): the run's summary counts it
  -- answered now, as a winning finish would (lib_run_summary.lua).
  touch_run(KEYS[5], ARGV[4], -1, (call[1] == 'running' and call[4] == '1') and -1 or 0)
end
if redis.call('TTL', KEYS[1]) < 0 then
  redis.call('EXPIRE', KEYS[1], ttl)
end
if redis.call('ZADD', KEYS[2], 'NX', ARGV[4], ARGV[1]) == 1 and redis.call('TTL', KEYS[2]) < 0 then
  redis.call('EXPIRE', KEYS[2], ttl)
end
redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], ttl)
return 1
