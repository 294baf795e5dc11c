-- The run phase of one sweep, for one page of one index bucket (single Redis node only).
-- KEYS: the bucket's by_deadline and by_progress indexes. ARGV: now_ms, stalled_after_ms,
-- auto_recover ('1'|'0'), the key prefix, the page size, then how many members of each
-- index's range to skip (what earlier pages of this sweep left in it).
-- The script reads its due members by score itself and builds each run's record key from
-- its member ('<prefix>:{' .. member .. '}:run', see workers/store/keys.py: member_run_key):
-- nothing per run crosses the wire but what needs the client. The run records span many
-- slots, so the cluster-safe path is pipelined.
--
-- The members are the bucket's runs past their deadline and the runs quiet for
-- stalled_after_ms in the index. Each is classified from its record's summary exactly as
-- workers.core.run_health.judge does: the later of started_ms and progress_ms (latest
-- activity of any call), open_n (calls without a result) and claimed_n (calls a worker
-- holds), kept by the ledger scripts. One hash read per run. A running run that needs no
-- alert and no action is settled here: its class stored when it changed, its progress
-- score moved forward to its latest activity when active or long_running (out of the quiet
-- range, so the next page's skip counts only what stayed). Every other run (record gone,
-- not running, alert, time-out, recovery) is returned for the caller to confirm and act on.
-- tests/integration/test_sweep_parity_runs.py holds this to judge() on every generated row
-- of the decision table.
-- Returns {{class, count, ...}, {member, ...}, deadline members read, quiet members read,
-- quiet members that stayed in the quiet range}.
local now, stalled = tonumber(ARGV[1]), tonumber(ARGV[2])
local recover = ARGV[3] == '1'
local key_head = ARGV[4] .. ':{'
local page = tonumber(ARGV[5])

local moved = {} -- score, member, ...: progress found in the records, one ZADD per page

-- Returns the class of a running run and whether it moved forward in the progress index,
-- or nil when the caller must judge it. Written for speed (it runs once per due run): one
-- HMGET, no helper calls, a stored time string reused as the new index score.
local function settle(member)
  local run = redis.call('HMGET', key_head .. member .. '}:run', 'status', 'progress_ms', 'deadline_ms',
                         'class', 'open_n', 'claimed_n', 'started_ms')
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
    redis.call('HSET', key_head .. member .. '}:run', 'class', klass)
  end
  if klass == 'active' or klass == 'long_running' then
    moved[#moved + 1] = last_text
    moved[#moved + 1] = member
    return klass, true
  end
  return klass, false
end

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', ARGV[6], page)
local quiet = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - stalled, 'LIMIT', ARGV[7], page)
local counts, rest, stayed = {}, {}, #quiet
local function visit(member)
  local klass, forward = settle(member)
  if klass then
    counts[klass] = (counts[klass] or 0) + 1
  else
    rest[#rest + 1] = member
  end
  return forward
end
-- Past-deadline runs are few (each ends this sweep): only then a lookup table, to read a
-- run in both ranges once, and to count it out of the quiet range when it moved forward.
local due_moved = {}
for _, member in ipairs(due) do due_moved[member] = visit(member) or false end
for _, member in ipairs(quiet) do
  local in_due = due_moved[member]
  if in_due == nil then
    if visit(member) then stayed = stayed - 1 end
  elseif in_due then
    stayed = stayed - 1
  end
end
if #moved > 0 then
  redis.call('ZADD', KEYS[2], 'XX', 'GT', unpack(moved))
end
local flat = {}
for klass, n in pairs(counts) do
  flat[#flat + 1] = klass
  flat[#flat + 1] = n
end
return {flat, rest, #due, #quiet, stayed}
