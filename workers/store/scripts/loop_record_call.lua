-- In Lua for bench.loops' target, as lib_loop_state.lua (docs/performance.md, "Decisions kept in Lua").
-- Append a pending call to a run's loop history; return its seq and what it is judged against.
--
-- KEYS[1]  history ZSET: member "<seq>|<entry json>", score = seq (monotonic per run)
-- KEYS[2]  detector state HASH (see lib_loop_state.lua)
-- ARGV[1]  history_size N: the window is the newest N records before this call
-- ARGV[2]  entry json (without seq)
-- ARGV[3]  ttl in seconds
-- ARGV[4]  now in ms (kept in the entry json; passed so the script never reads the clock)
-- ARGV[5]  'window' to return the window, 'signals' to return the call's signals
-- ARGV[6]  evidence_at: the ping-pong count from which its no-progress evidence is checked
-- ARGV[7]  the entry's tool     ARGV[8] its args hash (as in the json, so it is not decoded)
--
-- Both keys' TTLs are refreshed when the last refresh (the state's ttl_ms) is a tenth of the TTL
-- old, or from a clock that disagrees by as much, or the history is new: most checks then send
-- no EXPIRE, and the keys live between 0.9 and 1 TTL past a run's last check.
--
-- Up to N + 1 records are kept, so that discarding a blocked call (loop_discard.lua) leaves
-- exactly the N records OpenClaw keeps when it never records a blocked call.
-- Returns {seq, {member, ...}} with the window oldest first, or one JSON array (a single bulk
-- reply parses faster than a dozen): [seq, recent, stalled, latest, run_repeats,
-- unknown_streak, unknown_name, alternation, pair_a, pair_b, paired_tool, evidence] (false for
-- a missing string, 0/1 for evidence).
local hist, state = KEYS[1], KEYS[2]
local n, ttl = tonumber(ARGV[1]), tonumber(ARGV[3])
local entry = {t = ARGV[7], a = ARGV[8]}
local call = call_of(entry.t, entry.a)

-- One read of the state: what the signals need, and the size it was built for.
local function read_state()
  return redis.call('HMGET', state, 'size', 'alt', 'n:' .. call, 'k:' .. call, 'h:' .. call, 'res', 'dist',
                    'ttl_ms')
end
local row = read_state()
if tonumber(row[1]) ~= n then
  rebuild(hist, state, n)
  row = read_state()
end
local alt = row[2] and cjson.decode(row[2]) or NO_ALT
local last = redis.call('ZRANGE', hist, -1, -1, 'WITHSCORES')

local function unknown_streak()
  -- Most newest records have no unknown-tool name: then nothing is decoded.
  if not last[1] or not string.find(last[1], '"u":', 1, true) then
    return 0, false
  end
  local streak, name, older = 0, false, decode(last[1])
  local i = 1
  while older and older.t == entry.t and older.u and (not name or older.u == name) do
    name, streak, i = older.u, streak + 1, i + 1
    older = newest(hist, n, i)
  end
  return streak, name
end

local function signals()
  local streak, name = unknown_streak()
  local count, a, b, tool, evidence = 0, false, false, false, 0
  if alt.l >= 2 and alt.b == entry.a then
    count, a, b, tool = alt.l + 1, alt.a, alt.b, alt.t
    if count >= tonumber(ARGV[6]) then
      evidence = 1
      local sides = {}
      for j = 1, alt.l do
        local older = newest(hist, n, j)
        local side = j % 2
        if older.h == nil or (sides[side] and sides[side] ~= older.h) then
          evidence = 0
          break
        end
        sides[side] = older.h
      end
    end
  end
  local repeats = tonumber(row[6] or '0') - tonumber(row[7] or '0')
  return {tonumber(row[3] or '0'), tonumber(row[4] or '0'), row[5] or false, repeats,
          streak, name, count, a, b, tool, evidence}
end

local reply
if ARGV[5] == 'signals' then
  reply = signals()
else
  reply = {redis.call('ZRANGE', hist, -n, -1)}
end

local seq = 1
if last[2] then
  seq = tonumber(last[2]) + 1
end
entry.s = seq
redis.call('ZADD', hist, seq, seq .. '|' .. ARGV[2])
-- The state's writes, folded into one HSET: the new alternating tail (and the one it replaces,
-- for loop_discard.lua), this call's count, and the leaving record's counts.
local set, gone = {'alt', cjson.encode(next_alt(alt, entry, n)), 'alt_prev', row[2] or cjson.encode(NO_ALT),
                   'alt_seq', seq}, {}
local leaving = redis.call('ZRANGE', hist, -(n + 1), -(n + 1))
local old = leaving[1] and decode(leaving[1])
if old and call_of(old.t, old.a) == call then
  remove_oldest(state, old, set, gone, 1) -- one record of this call enters, one leaves
else
  put(set, 'n:' .. call, tonumber(row[3] or '0') + 1) -- a pending record: only its count changes
  if old then
    remove_oldest(state, old, set, gone, 0)
  end
end
local now = tonumber(ARGV[4])
local refresh = not last[1] or not row[8] or math.abs(now - tonumber(row[8])) >= ttl * 100
if refresh then
  put(set, 'ttl_ms', now)
end
flush(state, set, gone)
redis.call('ZREMRANGEBYRANK', hist, 0, -(n + 2))
if refresh then
  redis.call('EXPIRE', hist, ttl)
  redis.call('EXPIRE', state, ttl)
end
table.insert(reply, 1, seq)
if ARGV[5] == 'signals' then
  return cjson.encode(reply)
end
return reply
