-- Store a call's result, first writer wins. KEYS: call, late, open, done, lease, run.
-- ARGV: call_id, result_json, reason, now_ms, ttl_s, writer.
-- Returns 1 when this result is the one delivered, 0 when it was kept as late (audit only).
-- State 'done' is written together with the result (below), so one HGET of the state tells
-- both whether a result exists and whether the call was claimed.
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'done' then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  redis.call('EXPIRE', KEYS[2], ARGV[5])
  return 0
end
local was_claimed = state == 'running'
redis.call('HSET', KEYS[1], 'state', 'done', 'result', ARGV[2], 'reason', ARGV[3],
           'finished_ms', ARGV[4], 'writer', ARGV[6])
redis.call('EXPIRE', KEYS[1], ARGV[5])
local was_open = redis.call('ZREM', KEYS[3], ARGV[1]) == 1
redis.call('RPUSH', KEYS[4], ARGV[1])
redis.call('EXPIRE', KEYS[4], ARGV[5])
redis.call('DEL', KEYS[5])
touch_run(KEYS[6], ARGV[4], was_open and -1 or 0, was_claimed and -1 or 0)
return 1
