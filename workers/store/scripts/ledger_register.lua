-- Register a call once. KEYS: call, calls, open, run. ARGV: call_id, now_ms, deadline_ms, ttl_s,
-- then field/value pairs. Returns {created, run_status, guard_remaining}:
--   created 1 when new, 0 when the id was already registered (a resubmission after a gateway
--   restart must not dispatch twice), -1 when the run is no longer running (fencing: a
--   superseded, aborted or timed-out run cannot start new calls).
-- The run record rides along so the gateway needs no separate read per batch; it is read
-- once, with the run summary this registration updates.
local run = read_run(KEYS[4], {'status', 'guard_remaining'})
local status = run[4] or ''
local guard = tonumber(run[5] or '0')
if status ~= '' and status ~= 'running' then
  return {-1, status, guard}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, status, guard}
end
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], 'state', 'pending', 'submitted_ms', ARGV[2], 'deadline_ms', ARGV[3],
           'attempt', 0, unpack(fields))
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
redis.call('EXPIRE', KEYS[3], ARGV[4])
write_summary(KEYS[4], run, ARGV[2], 1, 0)
return {1, status, guard}
