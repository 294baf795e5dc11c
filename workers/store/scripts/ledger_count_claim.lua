-- Count a running call's claim in its run's summary (claimed_n), once. KEYS: call, run.
-- ARGV: now_ms. Returns 1 when this counted it, 0 when it was counted already or is not running.
-- A claim does not count itself (ledger_claim.lua): most calls are answered within a few
-- milliseconds, and counting them would be two writes of the run record undone at once. The
-- worker's lease keeper counts each call still running at its next tick, here; the call's
-- 'counted' flag says whether claimed_n holds it, so finish, requeue and a restored answer
-- take back only a counted claim. A claim is counted within one renew interval (at most half
-- a second), long before the watchdog's stalled_after_ms could ask for it.
local call = redis.call('HMGET', KEYS[1], 'state', 'counted')
if call[1] ~= 'running' or call[2] == '1' then
  return 0
end
redis.call('HSET', KEYS[1], 'counted', '1')
touch_run(KEYS[2], ARGV[1], 0, 1)
return 1
