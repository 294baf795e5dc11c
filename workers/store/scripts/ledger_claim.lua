-- A worker claims a call before running its tool. KEYS: call, lease, run (unused: see below).
-- ARGV: now_ms, worker_id, lease_ttl_ms, tool, job_digest (of the message received), nonce
-- (one per claim: the same claim sent again, after its replica acknowledgement came back
-- short, finds the call already its own and is answered 'claimed' with the same attempt),
-- deadline_ms of the message's job ('' for none; the digest binds it to the registration).
-- Returns {status, attempt, registered tool, previous worker, previous started_ms}; the last
-- two only when claimed again after an earlier attempt (a second execution of the call).
-- 'done' (answered: never run again),
-- 'unregistered' (no gateway registered this call: run nothing, nothing to answer),
-- 'mismatch' (the message is not the job registered: run nothing, answer the call),
-- 'mismatch_held' (likewise, but a live worker runs the registered job: leave it be),
-- 'expired' (the registered job, past its deadline and not answered yet: run nothing, its
-- gateway or the watchdog answers it; this is the message expiry Celery no longer checks),
-- 'busy' (another live worker holds the lease), 'lost' (an earlier claim's lease lapsed and
-- nobody answered the call yet: run nothing; its gateway or the watchdog requeues it if its
-- tool is idempotent, or answers it worker_lost, core/reaping.py), or 'claimed' (run it; the
-- lease is ours). A copy of the message (a give-back, a gateway's republish) must never run a
-- call whose worker was lost: that is a second execution of a tool not marked idempotent.
-- One read of the call: state 'done' is written with the result, in the same HSET
-- (ledger_finish.lua), and no script changes the state of an answered call, so it stands for
-- "has a result" without fetching the result. No EXPIRE: the registration gave the record
-- ledger.ttl_s past its deadline. No run summary either: the claim is counted in claimed_n
-- by the worker's lease keeper if the call is still running at its next tick
-- (ledger_count_claim.lua); a requeue (ledger_requeue.lua) takes a counted claim back.
local call = redis.call('HMGET', KEYS[1], 'state', 'attempt', 'tool', 'job_digest', 'worker',
                        'started_ms', 'claim')
local state, attempt = call[1], tonumber(call[2] or '0') or 0
if state == 'running' and ARGV[6] ~= '' and call[7] == ARGV[6] then
  return {'claimed', attempt, call[3] or ''} -- this very claim, sent again: nothing changes
end
if state == 'done' then
  return {'done', attempt, ''}
end
if not call[3] and redis.call('EXISTS', KEYS[1]) == 0 then
  return {'unregistered', 0, ''} -- never create the record: only a registration does
end
local tool = call[3] or ''
if tool ~= ARGV[4] or (call[4] or '') ~= ARGV[5] then
  local held = redis.call('EXISTS', KEYS[2]) == 1
  return {held and 'mismatch_held' or 'mismatch', attempt, tool}
end
if ARGV[7] ~= '' and tonumber(ARGV[1]) > tonumber(ARGV[7]) then
  return {'expired', attempt, tool}
end
if state == 'running' then
  return {redis.call('EXISTS', KEYS[2]) == 1 and 'busy' or 'lost', attempt, tool}
end
-- Take the lease only if nobody holds it: one command for "is it held?" and "hold it".
if not redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3], 'NX') then
  return {'busy', attempt, tool}
end
attempt = attempt + 1
redis.call('HSET', KEYS[1], 'state', 'running', 'started_ms', ARGV[1], 'hb_ms', ARGV[1],
           'worker', ARGV[2], 'attempt', attempt, 'claim', ARGV[6])
if attempt > 1 then
  return {'claimed', attempt, tool, call[5] or '', tonumber(call[6] or '0') or 0}
end
return {'claimed', attempt, tool}
