-- Kept beside workers.core.loops.signals.signals_of because bench.loops' check needs it (docs/performance.md, "Decisions kept in Lua").
-- Prepended to the loop-history scripts. Beside the history ZSET (member "<seq>|<entry json>",
-- score seq) each run keeps the detector's state in a HASH, so that a check reads a few
-- fields instead of parsing the window. The state describes the window: the newest `size`
-- records of the history (the ZSET may hold one more, see loop_record_call.lua).
--   size           the history size the state was built for; missing or different: rebuilt
--   n:<call>       records of this call in the window; <call> is "<#tool>:<tool><args hash>"
--   m:<call>       those with an outcome
--   k:<call> h:<call>  the newest outcomes of this call in a row with one result hash: how
--                  many, and that hash
--   s:<call>       seq of the newest record of this call with an outcome
--   x:<triple>     outcomes of this (tool, args hash, result hash) in the window
--   res dist       outcomes in the window, and distinct triples among them
--   alt            the window's alternating tail: {l = length, a = newest args, b = the
--                  other args or false, t = newest tool}; alt_prev/alt_seq: alt before the
--                  append of record alt_seq, restored when that record is discarded
--   ttl_ms         when loop_record_call.lua last refreshed both keys' TTLs
-- Every update is O(1) except two rare paths, which rebuild from the window: an outcome
-- attached out of order (to an older record of a call than its newest outcome), and a
-- discard that is not of the newest record. The unknown-tool and ping-pong evidence walks
-- read only the tail they describe.

local function decode(member)
  local sep = string.find(member, '|', 1, true)
  local entry = cjson.decode(string.sub(member, sep + 1))
  entry.s = tonumber(string.sub(member, 1, sep - 1))
  return entry
end

-- Length-prefixed, so no tool name can make two calls (or two triples) collide.
local function call_of(tool, args)
  return #tool .. ':' .. tool .. args
end

local function triple_of(entry)
  return #entry.t .. ':' .. entry.t .. #entry.a .. ':' .. entry.a .. entry.h
end

-- Add `by` to a counter; a counter that reaches zero is removed. Returns the new value.
local function bump(state, field, by)
  local value = redis.call('HINCRBY', state, field, by)
  if value <= 0 then
    redis.call('HDEL', state, field)
  end
  return value
end

local function add_outcome(state, entry, call, newest)
  local m = redis.call('HINCRBY', state, 'm:' .. call, 1)
  local streak = redis.call('HMGET', state, 'k:' .. call, 'h:' .. call)
  local k, h = tonumber(streak[1] or '0'), streak[2]
  if m == 1 then
    k, h = 1, entry.h
  elseif newest then
    if entry.h == h then k = k + 1 else k, h = 1, entry.h end
  elseif k == m - 1 and entry.h == h then
    k = k + 1 -- the oldest record comes back into a streak that reached the window's start
  end
  redis.call('HSET', state, 'k:' .. call, k, 'h:' .. call, h)
  if newest then
    redis.call('HSET', state, 's:' .. call, entry.s)
  end
  if bump(state, 'x:' .. triple_of(entry), 1) == 1 then
    redis.call('HINCRBY', state, 'dist', 1)
  end
  redis.call('HINCRBY', state, 'res', 1)
end

-- A record enters the window: as its newest record, or (newest false) as its oldest.
local function add(state, entry, newest)
  local call = call_of(entry.t, entry.a)
  bump(state, 'n:' .. call, 1)
  if entry.h ~= nil then
    add_outcome(state, entry, call, newest)
  end
end

local function put(list, field, value)
  list[#list + 1] = field
  list[#list + 1] = value
end

-- The oldest record of the window leaves it: at most one read here; its writes are added to
-- `set` and `gone`, for the caller's one HSET and one HDEL (flush). `entering` is 1 when the
-- append that pushes it out is a pending record of the same call (its count is then written
-- here, net of both), else 0.
local function remove_oldest(state, entry, set, gone, entering)
  local call = call_of(entry.t, entry.a)
  if entry.h == nil then
    if entering == 0 then
      bump(state, 'n:' .. call, -1)
    end
    return
  end
  local triple = 'x:' .. triple_of(entry)
  local row = redis.call('HMGET', state, 'n:' .. call, 'm:' .. call, 'k:' .. call, triple, 'res', 'dist')
  local n, m, k = tonumber(row[1] or '0') - 1 + entering, tonumber(row[2] or '0'), tonumber(row[3] or '0')
  local x, res, dist = tonumber(row[4] or '0') - 1, tonumber(row[5] or '0') - 1, tonumber(row[6] or '0')
  put(set, 'res', res)
  if n > 0 then
    put(set, 'n:' .. call, n)
  else
    gone[#gone + 1] = 'n:' .. call
  end
  if m <= 1 then
    for _, field in ipairs({'m:', 'k:', 'h:', 's:'}) do gone[#gone + 1] = field .. call end
  else
    put(set, 'm:' .. call, m - 1)
    if k == m then -- the streak reached back to this record
      put(set, 'k:' .. call, k - 1)
    end
  end
  if x > 0 then
    put(set, triple, x)
  else
    gone[#gone + 1] = triple
    put(set, 'dist', dist - 1)
  end
end

-- Write what remove_oldest and its caller collected: one HSET, and one HDEL when needed.
local function flush(state, set, gone)
  if #set > 0 then
    redis.call('HSET', state, unpack(set))
  end
  if #gone > 0 then
    redis.call('HDEL', state, unpack(gone))
  end
end

local NO_ALT = {l = 0, a = false, b = false, t = false}

local function read_alt(state)
  local raw = redis.call('HGET', state, 'alt')
  if not raw then
    return NO_ALT
  end
  return cjson.decode(raw)
end

-- The alternating tail after `entry` is appended to a window of at most `size` records.
local function next_alt(alt, entry, size)
  local x, l, a, b = entry.a, alt.l, alt.a, alt.b
  if l == 0 or x == a then
    l, b = 1, false
  elseif b and x == b then
    l, b = l + 1, a
  else
    l, b = 2, a
  end
  if l > size then
    l = size
  end
  if l <= 1 then
    b = false
  end
  return {l = l, a = x, b = b, t = entry.t}
end

-- Recompute the whole state from the newest `size` records of the history.
local function rebuild(hist, state, size)
  redis.call('DEL', state)
  local alt = NO_ALT
  for _, member in ipairs(redis.call('ZRANGE', hist, -size, -1)) do
    local entry = decode(member)
    add(state, entry, true)
    alt = next_alt(alt, entry, size)
  end
  redis.call('HSET', state, 'size', size, 'alt', cjson.encode(alt))
end

local function ensure_state(hist, state, size)
  if tonumber(redis.call('HGET', state, 'size')) ~= size then
    rebuild(hist, state, size)
  end
end

-- The window's record at position i from its newest (1), or nil past the window's start.
local function newest(hist, size, i)
  if i > size then
    return nil
  end
  local found = redis.call('ZRANGE', hist, -i, -i)
  if found[1] == nil then
    return nil
  end
  return decode(found[1])
end

