-- Snapshot of unanswered calls. KEYS: call_1, lease_1, call_2, lease_2, ... (one run, one slot).
-- Returns per existing call: {call_id, state, deadline_ms, attempt, lease_alive, idempotent,
-- dispatched, submitted_ms, started_ms, hb_ms, tool}.
local out = {}
for i = 1, #KEYS, 2 do
  local f = redis.call('HMGET', KEYS[i], 'call_id', 'state', 'deadline_ms', 'attempt', 'idempotent',
                       'dispatched', 'submitted_ms', 'started_ms', 'hb_ms', 'tool')
  if f[1] then
    out[#out + 1] = {f[1], f[2], f[3], f[4], redis.call('EXISTS', KEYS[i + 1]), f[5], f[6], f[7], f[8], f[9], f[10]}
  end
end
return out
