-- The due-call probe of one sweep, for one page of one index bucket.
-- KEYS: the bucket's due index, its lease index, then per due call its call record and lease
-- (see workers/store/keys.py: member_call_keys). ARGV: now_ms, lease_ms. A call's index
-- member 'S/R/C' is taken from its record key '<prefix>:{S/R}:call:C' (not passed).
-- The record keys span many slots: single Redis node only. The cluster-safe path is
-- pipelined (workers/store/sweep_probe.py), and the two must decide alike.
--
-- The members are the bucket's calls due for a look (due index: the deadline, or the first
-- look one lease after submission) or whose lease ran out as last recorded (lease index),
-- read by score by the caller: O(due). Each is checked against its record: a record gone or
-- answered leaves both indexes; a lease still alive puts the call in the lease index by its
-- end (a first look) or re-scores it there (renewed, index lagging), and leaves the call due
-- at its deadline; a call queued for a worker leaves the lease index and is due at its
-- deadline (a claim that late indexes its lease, workers.core.waiting.past_first_look); one
-- never dispatched is kept until it is older than a lease. Returns the members to reap.
local now, lease_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local reap = {}
for i = 3, #KEYS, 2 do
  local call, lease = KEYS[i], KEYS[i + 1]
  local run, id = string.match(call, '{([^}]*)}:call:(.*)$')
  local member = run .. '/' .. id
  local f = redis.call('HMGET', call, 'state', 'deadline_ms', 'submitted_ms', 'dispatched')
  local state = f[1]
  local deadline = tonumber(f[2] or 0) or 0
  if not state or state == 'done' then
    redis.call('ZREM', KEYS[1], member)
    redis.call('ZREM', KEYS[2], member)
  elseif deadline <= now then
    reap[#reap + 1] = member
  elseif state == 'running' then
    local left = redis.call('PTTL', lease) -- -2: no lease, -1: no expiry
    if left == -2 then
      reap[#reap + 1] = member
    else
      redis.call('ZADD', KEYS[2], now + (left > 0 and left or lease_ms), member)
      redis.call('ZADD', KEYS[1], 'XX', deadline, member)
    end
  elseif f[4] == '1' then -- pending in the queue: its deadline covers it
    redis.call('ZREM', KEYS[2], member)
    redis.call('ZADD', KEYS[1], 'XX', deadline, member)
  elseif (tonumber(f[3] or 0) or 0) <= now - lease_ms then
    reap[#reap + 1] = member
  end
end
return reap
