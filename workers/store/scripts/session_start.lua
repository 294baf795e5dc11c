-- Mark a run running under a lane token. KEYS: run (the run's record, run slot).
-- ARGV: token, now_ms, deadline_ms, agent_id, ttl_s.
-- Returns the run's deadline (ms), or 0 when the run already ended (it cannot start again).
local status = redis.call('HGET', KEYS[1], 'status')
if status and status ~= 'running' then
  return 0
end
redis.call('HSETNX', KEYS[1], 'started_ms', ARGV[2])
redis.call('HSETNX', KEYS[1], 'deadline_ms', ARGV[3])
redis.call('HSETNX', KEYS[1], 'agent_id', ARGV[4])
local progress = tonumber(redis.call('HGET', KEYS[1], 'progress_ms') or '0')
if progress < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'progress_ms', ARGV[2])
end
redis.call('HSET', KEYS[1], 'status', 'running', 'token', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return tonumber(redis.call('HGET', KEYS[1], 'deadline_ms'))
