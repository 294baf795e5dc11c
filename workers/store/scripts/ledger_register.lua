-- Register a call once. KEYS: call, calls, run[, broker queue]. ARGV: call_id, now_ms,
-- deadline_ms, ttl_s, refresh_s, keys_until_ms, message ('' for none), then field/value pairs,
-- the last pair 'reg' and this registration's nonce. Returns {created, run_status, guard_remaining}:
--   created 1 when new, 0 when the id was already registered (a resubmission after a gateway
--   restart must not dispatch twice), -1 when the run is no longer running (fencing: a
--   superseded, aborted or timed-out run cannot start new calls). The same registration sent
--   again (its replica acknowledgement came back short) finds its own nonce: created 1 again,
--   nothing written or pushed twice.
-- With a message and the broker queue's list (a Redis broker on this same single node), a new
-- call's task message is pushed here too: registration and publication are one step, so no
-- call is registered without its message or published unregistered, and the gateway saves a
-- round trip and Celery's publish path (workers/celery_edge/messages.py).
-- The run record rides along so the gateway needs no separate read per batch; it is read
-- once, with the run summary this registration updates.
--
-- TTLs (see workers/store/keys.py): the call record is given ttl_s past its deadline (plus one
-- refresh interval for clocks that disagree), so claim and finish need not extend it; only a
-- finish past the deadline does. The run's calls key expires at keys_until_ms, an absolute
-- time past every deadline of its calls (workers/store/run_indexes.py): set only when later
-- than the run record's keys_until_ms, so about once per refresh interval. Calls are never
-- removed from it, so it never empties (an emptied key would lose its TTL), and it outlives
-- every record it lists: ZADD NX on it is the check that the id is new.
-- Which calls are still open is each record's state (and the run summary's open_n): no set
-- of open calls is kept, so registering costs no ZADD and finishing no ZREM.
local run = read_run(KEYS[3], {'status', 'guard_remaining'})
local status = run[RUN_EXTRA + 1] or ''
local guard = tonumber(run[RUN_EXTRA + 2] or '0')
if status ~= '' and status ~= 'running' then
  return {-1, status, guard}
end
-- A new call (most) costs one ZADD NX, which lists it too; the nonce is read only for an id
-- seen before. An id listed without a record (a record lost by hand) registers anew.
if redis.call('ZADD', KEYS[2], 'NX', ARGV[2], ARGV[1]) == 0 then
  local registered = redis.call('HGET', KEYS[1], 'reg')
  if registered or redis.call('EXISTS', KEYS[1]) == 1 then
    return {registered == ARGV[#ARGV] and 1 or 0, status, guard}
  end
end
local now, deadline = tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl, refresh, expires = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local fields = {}
for i = 8, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], 'state', 'pending', 'submitted_ms', ARGV[2], 'deadline_ms', ARGV[3],
           'attempt', 0, unpack(fields))
redis.call('EXPIRE', KEYS[1], ttl + refresh + math.max(0, math.ceil((deadline - now) / 1000)))
if (tonumber(run[KEYS_UNTIL] or '') or 0) >= expires then
  write_summary(KEYS[3], run, ARGV[2], 1, 0)
else
  redis.call('PEXPIRE', KEYS[2], math.max(1, expires - now))
  write_summary(KEYS[3], run, ARGV[2], 1, 0, 'keys_until_ms', ARGV[6])
end
if ARGV[7] ~= '' then
  redis.call('LPUSH', KEYS[4], ARGV[7])
end
return {1, status, guard}
