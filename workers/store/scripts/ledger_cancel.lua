-- Mark calls of one run as cancel-requested. KEYS: call records (one run). ARGV: now_ms.
-- Only an unanswered call is marked, and only once (the first request's time is kept).
-- Returns, per call, {state, cancel_ms}: state '' when the call is unknown or already answered.
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 and redis.call('HEXISTS', key, 'result') == 0 then
    redis.call('HSETNX', key, 'cancel_ms', ARGV[1])
    out[i] = {redis.call('HGET', key, 'state') or 'pending', redis.call('HGET', key, 'cancel_ms')}
  else
    out[i] = {'', '0'}
  end
end
return out
