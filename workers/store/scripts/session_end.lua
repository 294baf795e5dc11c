-- End a running run once. KEYS: run. ARGV: status, now_ms, reason, expected_token ('' = any).
-- Returns 1 when this call ended it, 0 when it had ended already or the token does not match.
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return 0
end
if ARGV[4] ~= '' and redis.call('HGET', KEYS[1], 'token') ~= ARGV[4] then
  return 0
end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'ended_ms', ARGV[2], 'end_reason', ARGV[3])
return 1
