-- Keeps lib_loop_state.lua's state (why it is in Lua: there).
-- Remove a call appended by loop_record_call.lua that was then blocked, as if never appended.
--
-- KEYS[1]  history ZSET    KEYS[2]  detector state HASH (see lib_loop_state.lua)
-- ARGV[1]  the call's seq
--
-- The usual case is the newest record, still pending: its count goes, the record one past
-- the window's start comes back into it, and the alternating tail is restored. Anything
-- else leaves the state to be rebuilt by the next script that reads it.
local hist, state, seq = KEYS[1], KEYS[2], tonumber(ARGV[1])
if redis.call('ZCOUNT', hist, seq, seq) == 0 then
  return 0 -- nothing to discard: the state stands
end
local size = tonumber(redis.call('HGET', state, 'size'))
local last = redis.call('ZRANGE', hist, -1, -1, 'WITHSCORES')
local entry = last[1] and decode(last[1])
local usual = size and entry and tonumber(last[2]) == seq and entry.h == nil
    and tonumber(redis.call('HGET', state, 'alt_seq')) == seq
if not usual then
  redis.call('ZREMRANGEBYSCORE', hist, seq, seq)
  redis.call('HDEL', state, 'size')
  return 0
end
bump(state, 'n:' .. call_of(entry.t, entry.a), -1)
redis.call('ZREMRANGEBYSCORE', hist, seq, seq)
local back = redis.call('ZRANGE', hist, -size, -size)
if back[1] and redis.call('ZCARD', hist) >= size then
  add(state, decode(back[1]), false)
end
redis.call('HSET', state, 'alt', redis.call('HGET', state, 'alt_prev'))
redis.call('HDEL', state, 'alt_prev', 'alt_seq')
return 1
