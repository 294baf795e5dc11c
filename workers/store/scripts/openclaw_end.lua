-- An OpenClaw call leaves open once: the plugin's end, or the watchdog's kill or abort,
-- whichever comes first (first writer wins, like a call's result).
--
-- KEYS[1]  the call's record HASH   KEYS[2]  open calls ZSET   KEYS[3]  session activity ZSET
-- ARGV[1]  final state   ARGV[2]  now ms   ARGV[3]  open member 'S/C'   ARGV[4]  quoted session
-- Returns 1 when this end won, 0 when the call had ended already (or is unknown).
local state = redis.call('HGET', KEYS[1], 'state')
redis.call('ZREM', KEYS[2], ARGV[3])
if state ~= 'open' then
  return 0
end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'ended_ms', ARGV[2])
redis.call('ZADD', KEYS[3], 'GT', ARGV[2], ARGV[4])
return 1
