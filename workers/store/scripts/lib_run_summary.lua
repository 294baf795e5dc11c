-- Prepended to the ledger scripts that change a call (register, claim, heartbeat, finish,
-- requeue). They keep a summary on the run record, in the run's own slot, so that a sweep
-- reads one hash per run instead of every call:
--   progress_ms  the latest activity of any call (raised, never lowered)
--   open_n       calls without a result (register +1, the winning finish -1)
--   claimed_n    calls a worker has claimed and not answered, counted by the lease keeper once
--                running (ledger_count_claim.lua +1; finish, requeue of a counted claim -1)
-- Nothing is written when the run record does not exist (a call outside a run, or a record
-- that expired): a summary never creates a run. Every call change pays for this, so it is
-- one HMGET and at most one HSET (counters never go below zero).
--
-- The same HMGET reads keys_until_ms, when the run's calls key expires as a registration last
-- set it (workers/store/run_indexes.py): a registration whose own time is not later skips its
-- PEXPIRE. No record, no field: then it always expires.
local SUMMARY_FIELDS = {'progress_ms', 'open_n', 'claimed_n', 'keys_until_ms'}
local KEYS_UNTIL = 4 -- position in read_run's row
local RUN_EXTRA = #SUMMARY_FIELDS -- read_run's `extra` fields come after this position

-- The run's summary fields, read once; `extra` field names are read in the same HMGET and
-- returned after them (register reads the run's status and guard this way).
local function read_run(run, extra)
  local fields = {unpack(SUMMARY_FIELDS)}
  for _, name in ipairs(extra or {}) do fields[#fields + 1] = name end
  return redis.call('HMGET', run, unpack(fields))
end

-- Apply a change to a summary read by read_run (`row`); returns nothing. `ttl_field` and
-- `ttl_ms`, when given, record when some keys expire (keys_until_ms).
local function write_summary(run, row, now_ms, open_delta, claimed_delta, ttl_field, ttl_ms)
  local progress, open_n, claimed_n = row[1], row[2], row[3]
  if not progress and not open_n and not claimed_n and not row[KEYS_UNTIL]
     and redis.call('EXISTS', run) == 0 then
    return
  end
  local changes = {}
  if now_ms and (tonumber(progress) or 0) < tonumber(now_ms) then
    changes[#changes + 1] = 'progress_ms'
    changes[#changes + 1] = now_ms
  end
  if open_delta ~= 0 then
    changes[#changes + 1] = 'open_n'
    changes[#changes + 1] = math.max(0, (tonumber(open_n) or 0) + open_delta)
  end
  if claimed_delta ~= 0 then
    changes[#changes + 1] = 'claimed_n'
    changes[#changes + 1] = math.max(0, (tonumber(claimed_n) or 0) + claimed_delta)
  end
  if ttl_field then
    changes[#changes + 1] = ttl_field
    changes[#changes + 1] = ttl_ms
  end
  if #changes > 0 then
    redis.call('HSET', run, unpack(changes))
  end
end

local function touch_run(run, now_ms, open_delta, claimed_delta)
  write_summary(run, read_run(run), now_ms, open_delta, claimed_delta)
end

