-- Store a call's result, first writer wins. KEYS: call, late, done, run, calls.
-- ARGV: call_id, result_json, reason, now_ms, ttl_s, writer, refresh_s.
-- Returns 1 when this result is the one delivered, 0 when it was kept as late (audit only).
-- The same result from the same writer, sent again (its replica acknowledgement came back
-- short), finds itself delivered: 1, and nothing written twice.
-- State 'done' is written together with the result (below), so one read of the state tells
-- both whether a result exists and whether the call was claimed.
-- TTLs (see ledger_register.lua): the record lives ttl_s past its deadline already, so only an
-- answer past the deadline (or a record the registration did not write) extends it. The done
-- list gets its TTL here only when the run is not running (ended, or no record): a running
-- run's waiters empty it on every wake-up, and it is given its TTL when the run ends
-- (session_end.lua, mark_run_aborted) or its record is found gone (the watchdog's drop_stale).
-- The done signal is the result, then '\31' (U+001F, which JSON never holds raw), then the call
-- id: the waiter it wakes has the answer without reading the record back (the result sits in
-- the list too until popped). workers/store/ledger.py (Signal) reads it; keep the two agreeing.
-- The worker's lease is not deleted: it runs out by itself within lease.ttl_s (its keeper
-- stops renewing when the task ends), and every reader of a lease reads the call's state
-- first, so a lease on an answered call means nothing. That saves a DEL per call; the price
-- is up to lease.ttl_s of a small key per answered call (the record itself lives ledger.ttl_s).
local call = redis.call('HMGET', KEYS[1], 'state', 'deadline_ms', 'writer', 'result', 'counted')
local state = call[1]
local ttl, refresh = tonumber(ARGV[5]), tonumber(ARGV[7])
if state == 'done' and call[3] == ARGV[6] and call[4] == ARGV[2] then
  return 1
end
if state == 'done' then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  redis.call('EXPIRE', KEYS[2], ttl)
  return 0
end
local was_counted = state == 'running' and call[5] == '1' -- in claimed_n (ledger_count_claim.lua)
local was_open = state ~= false -- registered (a state), and not answered (not 'done', above)
redis.call('HSET', KEYS[1], 'state', 'done', 'result', ARGV[2], 'reason', ARGV[3],
           'finished_ms', ARGV[4], 'writer', ARGV[6])
if tonumber(ARGV[4]) > (tonumber(call[2] or 0) or 0) then
  redis.call('EXPIRE', KEYS[1], ttl)
end
if state == false then
  -- A call answered without a registration (Redis was unreachable when it was submitted, and
  -- the gateway stores its answer now): listed in its run's calls like any other, so collect,
  -- the CLI and repair find it. The key's TTL is set when this creates it.
  if redis.call('ZADD', KEYS[5], 'NX', ARGV[4], ARGV[1]) == 1 and redis.call('TTL', KEYS[5]) < 0 then
    redis.call('EXPIRE', KEYS[5], ttl + 2 * refresh)
  end
end
redis.call('RPUSH', KEYS[3], ARGV[2] .. '\31' .. ARGV[1])
local run = read_run(KEYS[4], {'status'})
if run[RUN_EXTRA + 1] ~= 'running' then
  redis.call('EXPIRE', KEYS[3], ttl + 2 * refresh)
end
write_summary(KEYS[4], run, ARGV[4], was_open and -1 or 0, was_counted and -1 or 0)
return 1
