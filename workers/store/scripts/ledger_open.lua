-- Snapshot of calls. KEYS: call_1, lease_1, call_2, lease_2, ... (one run, one slot).
-- ARGV: the call-record fields to read (names from workers/store/records.py).
-- Returns per call: {lease_alive (1|0), {the fields' values in ARGV order, nil when missing}}.
local out = {}
for i = 1, #KEYS, 2 do
  out[#out + 1] = {redis.call('EXISTS', KEYS[i + 1]), redis.call('HMGET', KEYS[i], unpack(ARGV))}
end
return out
