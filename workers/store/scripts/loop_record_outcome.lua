-- Keeps lib_loop_state.lua's state (why it is in Lua: there); its guard part must be one step.
-- Attach an outcome hash to a run's loop history and feed the post-compaction guard.
--
-- KEYS[1]  history ZSET (see loop_record_call.lua)
-- KEYS[2]  run HASH: fields guard_remaining (int), guard_window (triples, one JSON array per line)
-- KEYS[3]  detector state HASH (see lib_loop_state.lua)
-- ARGV[1]  history_size N, or "" to leave the history alone (detection off)
-- ARGV[2]  tool     ARGV[3] args hash     ARGV[4] tool call id or ""
-- ARGV[5]  result hash                    ARGV[6] unknown tool name or ""
-- ARGV[7]  entry json for a fresh record (without seq)
-- ARGV[8]  guard triple json, or "" to skip the guard
-- ARGV[9]  ttl in seconds                 ARGV[10] now in ms
--
-- The outcome attaches to the newest pending record of the same call id (when given), tool
-- and args hash among the newest N; otherwise a fresh record is appended. Then trim to N.
-- Returns the guard window (string) when the guard observed this outcome, else false.
local hist, run, state = KEYS[1], KEYS[2], KEYS[3]
local ttl = tonumber(ARGV[9])

local function keep(key)
  -- The run hash is shared with the gateway: only ever extend its TTL, never shorten it.
  if redis.call('TTL', key) < ttl then
    redis.call('EXPIRE', key, ttl)
  end
end

if ARGV[1] ~= '' then
  local n = tonumber(ARGV[1])
  ensure_state(hist, state, n)
  local members = redis.call('ZRANGE', hist, -n, -1, 'WITHSCORES')
  local attached = false
  for i = #members - 1, 1, -2 do
    local member = members[i]
    local sep = string.find(member, '|', 1, true)
    local entry = cjson.decode(string.sub(member, sep + 1))
    if entry.h == nil and entry.t == ARGV[2] and entry.a == ARGV[3]
        and (ARGV[4] == '' or entry.c == ARGV[4]) then
      entry.h = ARGV[5]
      if ARGV[6] ~= '' then
        entry.u = ARGV[6]
      end
      redis.call('ZREM', hist, member)
      redis.call('ZADD', hist, members[i + 1], string.sub(member, 1, sep) .. cjson.encode(entry))
      entry.s = tonumber(members[i + 1])
      local call = call_of(entry.t, entry.a)
      local newest = tonumber(redis.call('HGET', state, 's:' .. call) or '0')
      if entry.s > newest then
        add_outcome(state, entry, call, true)
      else
        redis.call('HDEL', state, 'size') -- an older record answered after a newer one: rebuild
      end
      attached = true
      break
    end
  end
  if not attached then
    local last = redis.call('ZRANGE', hist, -1, -1, 'WITHSCORES')
    local seq = 1
    if last[2] then
      seq = tonumber(last[2]) + 1
    end
    redis.call('ZADD', hist, seq, seq .. '|' .. ARGV[7])
    local entry = cjson.decode(ARGV[7])
    entry.s = seq
    local alt = read_alt(state)
    add(state, entry, true)
    local leaving = redis.call('ZRANGE', hist, -(n + 1), -(n + 1))
    local set, gone = {'alt', cjson.encode(next_alt(alt, entry, n))}, {'alt_prev', 'alt_seq'}
    if leaving[1] then
      remove_oldest(state, decode(leaving[1]), set, gone, 0)
    end
    flush(state, set, gone)
  end
  redis.call('ZREMRANGEBYRANK', hist, 0, -(n + 1))
  ensure_state(hist, state, n)
  redis.call('EXPIRE', hist, ttl)
  redis.call('EXPIRE', state, ttl)
end

if ARGV[8] == '' then
  return false
end
local remaining = tonumber(redis.call('HGET', run, 'guard_remaining') or '0')
if remaining <= 0 then
  return false
end
local window = redis.call('HGET', run, 'guard_window')
if window and window ~= '' then
  window = window .. '\n' .. ARGV[8]
else
  window = ARGV[8]
end
redis.call('HSET', run, 'guard_remaining', remaining - 1, 'guard_window', window)
keep(run)
return window
