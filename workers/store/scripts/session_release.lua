-- Free a session's lane if the given run (and token, unless '') still holds it. KEYS: lane.
-- ARGV: run_id, token. Returns 1 when released, 0 when someone else holds it (fencing).
if redis.call('HGET', KEYS[1], 'run_id') ~= ARGV[1] then
  return 0
end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'token') ~= ARGV[2] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
