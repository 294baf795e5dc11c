-- The run phase of one sweep. KEYS: by_deadline, by_progress.
-- ARGV: prefix, now_ms, stalled_after_ms, auto_recover ('1'|'0'), limit, recent_calls.
-- Single Redis node only: it reads the run and call keys of many runs (many hash slots)
-- without declaring them (see workers/store/keys.py); the cluster-safe path is pipelined.
--
-- Reads the runs past their deadline and the runs quiet for stalled_after_ms (as the
-- pipelined path does) with their recent and open calls, and classifies each exactly as
-- workers.core.watchdog.judge does. A running run that needs no alert and no action is
-- settled here: its class stored when it changed, its progress score moved forward to its
-- latest activity when active or long_running. Every other run (record gone, not running,
-- alert, time-out, recovery) is returned for the caller to judge and act on.
-- Returns {{class, count, ...}, {member, ...}}.
local prefix, now, stalled = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local recover, limit, recent = ARGV[4] == '1', tonumber(ARGV[5]), tonumber(ARGV[6])

local function num(v)
  return tonumber(v or 0) or 0
end

local function hex(ch)
  return string.format('%%%02X', string.byte(ch))
end

local function quote(part) -- as workers.store.keys.quote_part
  if not string.find(part, '[^%w%-_%.~@]') then
    return part
  end
  return (string.gsub(part, '[^%w%-_%.~@]', hex))
end

local members, seen = {}, {}
local function add(list)
  for _, m in ipairs(list) do
    if not seen[m] then
      seen[m] = true
      members[#members + 1] = m
    end
  end
end
add(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, limit))
add(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', string.format('%.0f', now - stalled), 'LIMIT', 0, limit))

local moved = {} -- score, member, ...: progress found in the calls, one ZADD per batch

-- Returns the class of a running run, or nil when the caller must judge it.
local function settle(member, base)
  local run = redis.call('HMGET', base .. 'run', 'status', 'started_ms', 'deadline_ms', 'progress_ms', 'class')
  if run[1] ~= 'running' then
    return nil
  end
  local started, progress = num(run[2]), num(run[4])
  if progress == 0 then
    progress = started
  end
  local last = math.max(started, progress)
  local ids, listed = {}, {}
  for _, list in ipairs({
    redis.call('ZREVRANGE', base .. 'calls', 0, recent - 1),
    redis.call('ZRANGE', base .. 'open', 0, recent - 1),
  }) do
    for _, id in ipairs(list) do
      if not listed[id] then
        listed[id] = true
        ids[#ids + 1] = id
      end
    end
  end
  local open, working = false, false
  for _, id in ipairs(ids) do
    local q = quote(id)
    local f = redis.call('HMGET', base .. 'call:' .. q, 'state', 'submitted_ms', 'started_ms', 'hb_ms', 'finished_ms')
    if f[1] then
      last = math.max(last, num(f[2]), num(f[3]), num(f[4]), num(f[5]))
      if f[1] ~= 'done' then
        open = true
      end
      if f[1] == 'running' and not working then
        working = redis.call('EXISTS', base .. 'lease:' .. q) == 1
      end
    end
  end
  local klass
  if now - last < stalled then
    klass = open and 'long_running' or 'active'
  else
    klass = working and 'stalled' or 'stuck'
  end
  local previous = run[5] or ''
  local deadline = num(run[3])
  if (klass == 'stalled' or klass == 'stuck') and previous ~= klass then
    return nil -- alert
  end
  if (deadline ~= 0 and now >= deadline) or (klass == 'stuck' and recover) then
    return nil -- time-out or recovery
  end
  if previous ~= klass then
    redis.call('HSET', base .. 'run', 'class', klass)
  end
  if klass == 'active' or klass == 'long_running' then
    moved[#moved + 1] = string.format('%.0f', last)
    moved[#moved + 1] = member
  end
  return klass
end

local function flush()
  if #moved > 0 then
    redis.call('ZADD', KEYS[2], 'XX', 'GT', unpack(moved))
    moved = {}
  end
end

local counts, rest = {}, {}
for _, member in ipairs(members) do
  local s, r = string.match(member, '^([^/]*)/([^/]*)$')
  local klass = s and settle(member, prefix .. ':{' .. s .. '/' .. r .. '}:')
  if klass then
    counts[klass] = (counts[klass] or 0) + 1
  else
    rest[#rest + 1] = member
  end
  if #moved >= 1000 then
    flush()
  end
end
flush()
local flat = {}
for klass, n in pairs(counts) do
  flat[#flat + 1] = klass
  flat[#flat + 1] = n
end
return {flat, rest}
