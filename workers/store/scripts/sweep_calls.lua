-- The due-call probe of one sweep. KEYS: the due index. ARGV: prefix, now_ms, lease_ms, limit.
-- Single Redis node only: it reads the call and lease keys of many runs (many hash slots)
-- without declaring them (see workers/store/keys.py); the cluster-safe path is pipelined.
-- Removes members whose call record expired. Returns the members of the calls to reap:
-- overdue, running without a live lease, or pending, never dispatched and older than a lease.
local prefix, now, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local rows = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[4]) - 1, 'WITHSCORES')
local reap = {}
for i = 1, #rows, 2 do
  local member, deadline = rows[i], tonumber(rows[i + 1])
  local s, r, c = string.match(member, '^([^/]*)/([^/]*)/([^/]*)$')
  if not s then
    reap[#reap + 1] = member -- malformed: the caller's parser reports it
  else
    local base = prefix .. ':{' .. s .. '/' .. r .. '}:'
    local state = redis.call('HGET', base .. 'call:' .. c, 'state')
    if not state then
      redis.call('ZREM', KEYS[1], member)
    elseif deadline <= now then
      reap[#reap + 1] = member
    elseif state == 'running' then
      if redis.call('EXISTS', base .. 'lease:' .. c) == 0 then
        reap[#reap + 1] = member
      end
    elseif state == 'pending' then
      local f = redis.call('HMGET', base .. 'call:' .. c, 'submitted_ms', 'dispatched')
      if f[2] ~= '1' and (tonumber(f[1] or 0) or 0) <= now - lease_ms then
        reap[#reap + 1] = member
      end
    end
  end
end
return reap
