-- Mark a run running under a lane token. KEYS: run (the run's record, run slot).
-- ARGV: token, now_ms, deadline_ms, agent_id, ttl_s.
-- Returns {deadline_ms, guard_remaining, status, abort_detector, abort_count, abort_message}:
-- what a batch needs of its run (workers/store/sessions.py: SessionStore.begin_and_open), so
-- opening a run takes no read after this. deadline_ms is 0 when the run already ended (it
-- cannot start again); its status and abort fields then say how.
-- One read and one write: started_ms, deadline_ms and agent_id are set once, progress_ms
-- only raised.
local run = redis.call('HMGET', KEYS[1], 'status', 'started_ms', 'deadline_ms', 'agent_id', 'progress_ms',
                       'guard_remaining', 'abort_detector', 'abort_count', 'abort_message')
if run[1] and run[1] ~= 'running' then
  return {0, run[6] or '0', run[1], run[7] or '', run[8] or '0', run[9] or ''}
end
local changes = {'status', 'running', 'token', ARGV[1]}
if not run[2] then
  changes[#changes + 1] = 'started_ms'
  changes[#changes + 1] = ARGV[2]
end
if not run[3] then
  changes[#changes + 1] = 'deadline_ms'
  changes[#changes + 1] = ARGV[3]
end
if not run[4] then
  changes[#changes + 1] = 'agent_id'
  changes[#changes + 1] = ARGV[4]
end
if (tonumber(run[5] or '0') or 0) < tonumber(ARGV[2]) then
  changes[#changes + 1] = 'progress_ms'
  changes[#changes + 1] = ARGV[2]
end
redis.call('HSET', KEYS[1], unpack(changes))
redis.call('EXPIRE', KEYS[1], ARGV[5])
return {tonumber(run[3] or ARGV[3]), run[6] or '0', 'running', '', '0', ''}
