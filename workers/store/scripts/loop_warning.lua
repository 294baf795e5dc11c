-- In Lua because the read, the comparison and the write must be one step (docs/performance.md, "Decisions kept in Lua").
-- Warning de-duplication: emit only when the bucket grows.
--
-- KEYS[1]  run HASH: field "loop_warn:<key>" = "<insertion seq>:<last bucket>",
--          loop_warn_seq (insertion counter), loop_warn_count (keys held)
-- ARGV[1]  warning key    ARGV[2] bucket    ARGV[3] key limit (256)    ARGV[4] ttl in seconds
-- Returns 1 when the warning is emitted, 0 when it is suppressed.
local run, ttl = KEYS[1], tonumber(ARGV[4])
local field = 'loop_warn:' .. ARGV[1]
local bucket, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local current = redis.call('HGET', run, field)
local order
if current then
  local seq, last = string.match(current, '^(%d+):(%d+)$')
  if bucket <= tonumber(last) then
    return 0
  end
  order = seq
else
  if bucket <= 0 then
    return 0
  end
  local held = tonumber(redis.call('HGET', run, 'loop_warn_count') or '0')
  if held >= limit then
    -- Full: evict the key inserted first, as OpenClaw's insertion-ordered map does.
    local all = redis.call('HGETALL', run)
    local oldest_field, oldest_seq = nil, nil
    for i = 1, #all, 2 do
      if string.sub(all[i], 1, 10) == 'loop_warn:' then
        local seq = tonumber(string.match(all[i + 1], '^(%d+):'))
        if oldest_seq == nil or seq < oldest_seq then
          oldest_field, oldest_seq = all[i], seq
        end
      end
    end
    redis.call('HDEL', run, oldest_field)
  else
    redis.call('HSET', run, 'loop_warn_count', held + 1)
  end
  order = redis.call('HINCRBY', run, 'loop_warn_seq', 1)
end
redis.call('HSET', run, field, order .. ':' .. bucket)
if redis.call('TTL', run) < ttl then
  redis.call('EXPIRE', run, ttl)
end
return 1
