-- Count one more publish of a call's unclaimed message. KEYS: call, lease.
-- ARGV: expected_republishes, now_ms. Succeeds (1) only if the call is still unanswered,
-- pending, unleased and published expected_republishes times again so far: of gateways that
-- saw the same lost message at once (or a worker giving back a message it held), one publishes
-- it again. Nothing else changes: the call stays pending, and whichever copy a worker claims
-- first runs it (ledger_claim.lua).
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local call = redis.call('HMGET', KEYS[1], 'state', 'republishes', 'call_id')
if not call[3] or (call[1] or 'pending') ~= 'pending' or (call[2] or '0') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'republishes', tonumber(ARGV[1]) + 1, 'queued_ms', ARGV[2])
return 1
