-- A run enters or leaves its bucket's run indexes, atomically, in one command of the caller.
-- KEYS: the bucket's by_deadline, by_progress and ended indexes (one index slot).
-- ARGV: member, deadline_ms ('' when the run leaves), now_ms, ended ('1': it leaves as ended),
-- expire_s ('' for none: the caller's IndexTtl says when) for the indexes this writes to,
-- trim_before_ms ('' for none).
-- Entering: by_deadline scores the deadline, by_progress now (never lowered). Leaving: out of
-- both, into ended when it ended; the ended index is trimmed to the ledger's TTL when asked.
if ARGV[2] ~= '' then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
  redis.call('ZADD', KEYS[2], 'GT', ARGV[3], ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  if ARGV[4] == '1' then
    redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
  end
  if ARGV[6] ~= '' then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[6])
  end
end
if ARGV[5] ~= '' and ARGV[2] ~= '' then
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  redis.call('EXPIRE', KEYS[2], ARGV[5])
elseif ARGV[5] ~= '' then
  redis.call('EXPIRE', KEYS[3], ARGV[5])
end
return 1
