-- Prepended to the ledger scripts that change a call (register, claim, heartbeat, finish,
-- requeue). They keep a summary on the run record, in the run's own slot, so that a sweep
-- reads one hash per run instead of every call:
--   progress_ms  the latest activity of any call (raised, never lowered)
--   open_n       calls without a result (register +1, the winning finish -1)
--   claimed_n    calls a worker has claimed and not answered (claim +1, finish or requeue -1)
-- Nothing is written when the run record does not exist (a call outside a run, or a record
-- that expired): a summary never creates a run. Few calls on purpose: every call change
-- pays for them.
local function touch_run(run, now_ms, open_delta, claimed_delta)
  local progress = redis.call('HGET', run, 'progress_ms')
  if not progress and redis.call('EXISTS', run) == 0 then
    return
  end
  if now_ms and (tonumber(progress) or 0) < tonumber(now_ms) then
    redis.call('HSET', run, 'progress_ms', now_ms)
  end
  if open_delta ~= 0 and redis.call('HINCRBY', run, 'open_n', open_delta) < 0 then
    redis.call('HSET', run, 'open_n', 0)
  end
  if claimed_delta ~= 0 and redis.call('HINCRBY', run, 'claimed_n', claimed_delta) < 0 then
    redis.call('HSET', run, 'claimed_n', 0)
  end
end

