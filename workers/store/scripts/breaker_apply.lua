-- Apply a breaker transition decided by workers.core.breaker, if nobody changed it since
-- it was read. KEYS: breaker state, failures.
-- ARGV: expected generation, state, since_ms, probes, clear_failures (1/0), ttl_ms.
-- Returns 1 when applied, 0 when the generation moved on (read again and decide again).
local generation = tonumber(redis.call('HGET', KEYS[1], 'generation') or '0') or 0
if generation ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'since_ms', ARGV[3], 'probes', ARGV[4],
           'generation', generation + 1)
redis.call('PEXPIRE', KEYS[1], ARGV[6])
if ARGV[5] == '1' then
  redis.call('DEL', KEYS[2])
end
return 1
