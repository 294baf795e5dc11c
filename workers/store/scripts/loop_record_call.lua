-- Append a pending call to a run's loop history and return the window it is judged against.
--
-- KEYS[1]  history ZSET: member "<seq>|<entry json>", score = seq (monotonic per run)
-- ARGV[1]  history_size N: the window is the newest N records before this call
-- ARGV[2]  entry json (without seq)
-- ARGV[3]  ttl in seconds
-- ARGV[4]  now in ms (kept in the entry json; passed so the script never reads the clock)
--
-- Up to N + 1 records are kept, so that discarding a blocked call (ZREMRANGEBYSCORE seq seq)
-- leaves exactly the N records the reference keeps when it never records a blocked call.
-- Returns {seq, {member, ...}} with the window oldest first.
local key = KEYS[1]
local n = tonumber(ARGV[1])
local window = redis.call('ZRANGE', key, -n, -1)
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local seq = 1
if last[2] then
  seq = tonumber(last[2]) + 1
end
redis.call('ZADD', key, seq, seq .. '|' .. ARGV[2])
redis.call('ZREMRANGEBYRANK', key, 0, -(n + 2))
redis.call('EXPIRE', key, tonumber(ARGV[3]))
return {seq, window}
