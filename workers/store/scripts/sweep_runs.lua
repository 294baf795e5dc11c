-- The run phase of one sweep, for one page of one index bucket.
-- KEYS: the bucket's by_progress index, then the run record of each due run (see
-- workers/store/keys.py: member_run_key). ARGV: now_ms, stalled_after_ms, auto_recover
-- ('1'|'0'), the key prefix. A run's index member is its record key's hash tag content,
-- taken from the key (not passed: half the arguments). The run records span many slots:
-- single Redis node only; the cluster-safe path is pipelined.
--
-- The members are the bucket's runs past their deadline and the runs quiet for
-- stalled_after_ms in the index (read by score by the caller, as the pipelined path reads
-- them). Each is classified from its record's summary exactly as
-- workers.core.run_health.judge does: the later of started_ms and progress_ms (latest
-- activity of any call), open_n (calls without a result) and claimed_n (calls a worker
-- holds), kept by the ledger scripts. One hash read per run. A running run that needs no
-- alert and no action is settled here: its class stored when it changed, its progress
-- score moved forward to its latest activity when active or long_running. Every other run
-- (record gone, not running, alert, time-out, recovery) is returned for the caller to
-- confirm and act on. tests/integration/test_sweep_parity_runs.py holds this to judge()
-- on every generated row of the decision table.
-- Returns {{class, count, ...}, {member, ...}}.
local now, stalled = tonumber(ARGV[1]), tonumber(ARGV[2])
local recover = ARGV[3] == '1'
local tag_from = #ARGV[4] + 3 -- '<prefix>:{' .. member .. '}:run'

local function member_of(run_key)
  return string.sub(run_key, tag_from, -6)
end

local moved = {} -- score, member, ...: progress found in the records, one ZADD per batch

-- Returns the class of a running run, or nil when the caller must judge it. Written for
-- speed (it runs once per due run): one HMGET, no helper calls, a stored time string
-- reused as the new index score.
local function settle(run_key)
  local run = redis.call('HMGET', run_key, 'status', 'progress_ms', 'deadline_ms', 'class', 'open_n',
                         'claimed_n', 'started_ms')
  if run[1] ~= 'running' then
    return nil
  end
  -- The latest activity is the later of start and progress, as judge() takes it: progress_ms
  -- may be missing, or behind started_ms when the record was opened by a host whose clock is
  -- ahead of the one that reported the progress.
  local last, last_text = tonumber(run[2] or 0) or 0, run[2] -- the text is reused as index score
  local started = tonumber(run[7] or 0) or 0
  if started > last then
    last, last_text = started, run[7]
  elseif last == 0 then
    last_text = '0'
  end
  local klass
  if now - last < stalled then
    klass = (tonumber(run[5] or 0) or 0) > 0 and 'long_running' or 'active'
  else
    klass = (tonumber(run[6] or 0) or 0) > 0 and 'stalled' or 'stuck'
  end
  local previous = run[4] or ''
  local deadline = tonumber(run[3] or 0) or 0
  if (klass == 'stalled' or klass == 'stuck') and previous ~= klass then
    return nil -- alert
  end
  if (deadline ~= 0 and now >= deadline) or (klass == 'stuck' and recover) then
    return nil -- time-out or recovery
  end
  if previous ~= klass then
    redis.call('HSET', run_key, 'class', klass)
  end
  if klass == 'active' or klass == 'long_running' then
    moved[#moved + 1] = last_text
    moved[#moved + 1] = member_of(run_key)
  end
  return klass
end

local function flush()
  if #moved > 0 then
    redis.call('ZADD', KEYS[1], 'XX', 'GT', unpack(moved))
    moved = {}
  end
end

local counts, rest = {}, {}
for i = 2, #KEYS do
  local klass = settle(KEYS[i])
  if klass then
    counts[klass] = (counts[klass] or 0) + 1
  else
    rest[#rest + 1] = member_of(KEYS[i])
  end
end
flush()
local flat = {}
for klass, n in pairs(counts) do
  flat[#flat + 1] = klass
  flat[#flat + 1] = n
end
return {flat, rest}
