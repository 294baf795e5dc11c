-- Register a call once. KEYS: call, calls, open. ARGV: call_id, now_ms, deadline_ms, ttl_s, then
-- field/value pairs. Returns 1 when new, 0 when the call id was already registered (idempotent
-- resubmission after a gateway restart must not dispatch twice).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
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
return 1
