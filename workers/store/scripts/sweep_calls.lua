-- The due-call probe of one sweep. KEYS: the due index, the lease index.
-- ARGV: prefix, now_ms, lease_ms, limit.
-- Single Redis node only: it reads the call and lease keys of many runs (many hash slots)
-- without declaring them (see workers/store/keys.py); the cluster-safe path is pipelined
-- (workers/sweeper.py), and the two must decide alike.
--
-- Candidates come by score only, so the cost is O(due): calls past their deadline (due
-- index) and calls whose lease ran out as last recorded (lease index). Each is checked
-- against its record: a record gone or answered leaves both indexes; a lease still alive
-- (renewed, index lagging) is re-scored; a pending call nobody holds leaves the lease index
-- unless it was never dispatched and is older than a lease. Returns the members to reap.
local prefix, now, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local members, seen = {}, {}
for _, index in ipairs(KEYS) do
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[4]))) do
    if not seen[m] then
      seen[m] = true
      members[#members + 1] = m
    end
  end
end
local reap = {}
for _, member in ipairs(members) do
  local s, r, c = string.match(member, '^([^/]*)/([^/]*)/([^/]*)$')
  if not s then
    reap[#reap + 1] = member -- malformed: the caller's parser reports it
  else
    local base = prefix .. ':{' .. s .. '/' .. r .. '}:'
    local f = redis.call('HMGET', base .. 'call:' .. c, 'state', 'deadline_ms', 'submitted_ms', 'dispatched')
    local state = f[1]
    if not state or state == 'done' then
      redis.call('ZREM', KEYS[1], member)
      redis.call('ZREM', KEYS[2], member)
    elseif (tonumber(f[2] or 0) or 0) <= now then
      reap[#reap + 1] = member
    elseif state == 'running' then
      local left = redis.call('PTTL', base .. 'lease:' .. c) -- -2: no lease, -1: no expiry
      if left == -2 then
        reap[#reap + 1] = member
      else
        redis.call('ZADD', KEYS[2], 'XX', now + (left > 0 and left or lease_ms), member)
      end
    elseif f[4] == '1' then
      redis.call('ZREM', KEYS[2], member) -- pending in the queue: its deadline covers it
    elseif (tonumber(f[3] or 0) or 0) <= now - lease_ms then
      reap[#reap + 1] = member
    end
  end
end
return reap
