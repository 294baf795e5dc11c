-- Kept beside workers.core.run_health.judge because bench.watchdog's 50 ms sweep needs it (docs/performance.md, "Decisions kept in Lua").
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
-- stalled_after_ms in the index. A run past its deadline (by its by_deadline score, which
-- begin_run writes from the record's deadline_ms and nothing changes later) ends this sweep:
-- it is returned unread. Every other run is classified from its record's summary exactly as
-- workers.core.run_health.judge does: progress_ms (latest activity of the run or any call:
-- session_start sets it no earlier than started_ms and no writer lowers it, so it is the
-- later of the two judge() takes), open_n (calls without a result) and claimed_n (calls a
-- worker holds), kept by the ledger scripts. One five-field hash read per run. A running run
-- that needs no alert and no action is settled here: its class stored when it changed, its
-- progress score moved forward to its latest activity when active or long_running (out of
-- the quiet range, so the next page's skip counts only what stayed). Every other run (past
-- its deadline, record gone, no progress_ms, not running, alert, recovery) is returned for
-- the caller to judge from the whole record and act on.
-- tests/integration/test_sweep_parity_runs.py holds this to judge() on every generated row
-- of the decision table.
-- Returns {{class, count, ...}, {member, ...}, deadline members read, quiet members read,
-- quiet members that stayed in the quiet range}.
local now, stalled = tonumber(ARGV[1]), tonumber(ARGV[2])
local recover = ARGV[3] == '1'
local key_head = ARGV[4] .. ':{'
local page = tonumber(ARGV[5])
local fresh_after = now - stalled -- a run whose latest activity is later than this is not idle
local call, tonumber = redis.call, tonumber

local moved, n_moved = {}, 0
local counts, rest, n_rest = {}, {}, 0

-- (tonumber(text or 0) or 0) > 0, without parsing the counts the ledger writes ('0', '1'):
-- tonumber parses a string twice (Lua 5.1: lua_isnumber, then lua_tonumber), about 70 ns.
local function positive(text)
  if text == '1' then return true end
  if not text or text == '0' then return false end
  return (tonumber(text) or 0) > 0
end

local function hand_back(member)
  n_rest = n_rest + 1
  rest[n_rest] = member
end

-- Settles one running run (its class stored when it changed, its score queued for the page's
-- one ZADD when active or long_running) and returns whether it moved forward; a run the
-- caller must judge is handed back. Written for speed, as it runs once per due run: one
-- HMGET of the five fields the judgement needs (each field read costs about 0.2 us more:
-- its reply becomes a Lua string), the judgement inlined, the stored time string reused as
-- the new index score. Most of the time is memory, not this code: finding a record Redis
-- has not touched lately about 1.1 us (the same EXISTS on a cached key costs 0.1).
local function settle(member)
  local run_key = key_head .. member .. '}:run'
  local run = call('HMGET', run_key, 'status', 'progress_ms', 'open_n', 'class', 'claimed_n')
  local last_text = run[2]
  if run[1] ~= 'running' or not last_text then
    hand_back(member)
    return false
  end
  local last = tonumber(last_text) or 0
  local klass, forward = nil, false
  if last > fresh_after then
    forward = true
    klass = positive(run[3]) and 'long_running' or 'active'
  else
    klass = positive(run[5]) and 'stalled' or 'stuck'
    if run[4] ~= klass or (klass == 'stuck' and recover) then -- alert, or recovery
      hand_back(member)
      return false
    end
  end
  if run[4] ~= klass then
    call('HSET', run_key, 'class', klass)
  end
  counts[klass] = (counts[klass] or 0) + 1
  if forward then
    moved[n_moved + 1] = last_text
    moved[n_moved + 2] = member
    n_moved = n_moved + 2
  end
  return forward
end

local due = call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', ARGV[6], page)
local quiet = call('ZRANGEBYSCORE', KEYS[2], '-inf', fresh_after, 'LIMIT', ARGV[7], page)
local stayed = #quiet
-- Past-deadline runs are few (each ends this sweep): only then a lookup table, to hand a run
-- in both ranges back once and count it as staying in the quiet range (it is not moved).
if #due == 0 then
  for i = 1, #quiet do
    if settle(quiet[i]) then stayed = stayed - 1 end
  end
else
  local past = {}
  for i = 1, #due do
    past[due[i]] = true
    hand_back(due[i])
  end
  for i = 1, #quiet do
    local member = quiet[i]
    if not past[member] and settle(member) then stayed = stayed - 1 end
  end
end
if n_moved > 0 then
  call('ZADD', KEYS[2], 'XX', 'GT', unpack(moved))
end
local flat = {}
for klass, n in pairs(counts) do
  flat[#flat + 1] = klass
  flat[#flat + 1] = n
end
return {flat, rest, #due, #quiet, stayed}
