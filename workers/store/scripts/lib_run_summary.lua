-- Prepended to the ledger scripts that change a call (register, claim, heartbeat, finish,
-- requeue). They keep a summary on the run record, in the run's own slot, so that a sweep
-- reads one hash per run instead of every call:
--   progress_ms  the latest activity of any call (raised, never lowered)
--   open_n       calls without a result (register +1, the winning finish -1)
--   claimed_n    calls a worker has claimed and not answered (claim +1, finish or requeue -1)
-- Nothing is written when the run record does not exist (a call outside a run, or a record
-- that expired): a summary never creates a run.
local function raise_progress(run, now_ms)
  local progress = redis.call('HGET', run, 'progress_ms')
  if progress then
    if (tonumber(progress) or 0) < tonumber(now_ms) then
      redis.call('HSET', run, 'progress_ms', now_ms)
    end
  elseif redis.call('EXISTS', run) == 1 then
    redis.call('HSET', run, 'progress_ms', now_ms)
  end
end

local function add_count(run, field, delta)
  if redis.call('EXISTS', run) == 1 and redis.call('HINCRBY', run, field, delta) < 0 then
    redis.call('HSET', run, field, 0)
  end
end

