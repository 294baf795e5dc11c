-- Take a session's lane for a run. KEYS: lane, fence (one session slot).
-- ARGV: run_id, agent_id, now_ms, lease_until_ms, ttl_s.
-- Returns {token, previous_run_id or '', previous_token}. The token is strictly greater than
-- any token handed out before for this session, even if the fence counter expired meanwhile.
-- Re-taking a lane the run already holds returns its token and extends the lease.
local lane = redis.call('HMGET', KEYS[1], 'run_id', 'token')
local holder = lane[1]
if holder == ARGV[1] then
  redis.call('HSET', KEYS[1], 'lease_until_ms', ARGV[4])
  redis.call('PEXPIREAT', KEYS[1], ARGV[4])
  return {tonumber(lane[2]), '', 0}
end
local prev_token = tonumber(lane[2] or '0')
local token = redis.call('INCR', KEYS[2])
if token <= prev_token then
  token = prev_token + 1
  redis.call('SET', KEYS[2], token)
end
redis.call('EXPIRE', KEYS[2], ARGV[5])
if holder or lane[2] then
  redis.call('DEL', KEYS[1]) -- no field of the run before survives (a new lane has none)
end
redis.call('HSET', KEYS[1], 'run_id', ARGV[1], 'token', token, 'agent_id', ARGV[2],
           'since_ms', ARGV[3], 'lease_until_ms', ARGV[4])
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
return {token, holder or '', prev_token}
