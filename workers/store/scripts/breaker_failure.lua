-- Count one failure of a tool. KEYS: breaker state, failures.
-- ARGV: now_ms, window_ms, member, ttl_ms.
-- Returns {failures within the window (this one included), state, since_ms, probes, generation}.
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (tonumber(ARGV[1]) - tonumber(ARGV[2])))
redis.call('PEXPIRE', KEYS[2], ARGV[4])
local count = redis.call('ZCARD', KEYS[2])
local s = redis.call('HMGET', KEYS[1], 'state', 'since_ms', 'probes', 'generation')
return {count, s[1] or false, s[2] or false, s[3] or false, s[4] or false}
