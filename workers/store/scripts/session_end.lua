-- End a running run once. KEYS: run, done. ARGV: status, now_ms, reason, expected_token ('' =
-- any), done_ttl_s. Returns 1 when this call ended it, 0 when it had ended already or the token
-- does not match.
-- The run's done list gets its TTL here: while the run runs, its waiters empty it on every
-- wake-up and a finish sets no TTL (ledger_finish.lua); once it ended, what is left in it (no
-- gateway waits any longer) expires.
local run = redis.call('HMGET', KEYS[1], 'status', 'token')
if run[1] ~= 'running' or (ARGV[4] ~= '' and run[2] ~= ARGV[4]) then
  return 0
end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'ended_ms', ARGV[2], 'end_reason', ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[5])
return 1
