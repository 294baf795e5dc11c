-- Free a session's lane if the given run (and token, unless '') still holds it. KEYS: lane.
-- ARGV: run_id, token. Returns 1 when released, 0 when someone else holds it (fencing).
local lane = redis.call('HMGET', KEYS[1], 'run_id', 'token')
if lane[1] ~= ARGV[1] or (ARGV[2] ~= '' and lane[2] ~= ARGV[2]) then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
