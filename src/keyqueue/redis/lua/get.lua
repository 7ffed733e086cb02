-- get: Core.get (the FIFO's oldest, or once ranked the first ranked), with a
-- lease and a fencing token. Runs promote and reap first, so any client's get
-- releases due keys and expired leases.
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2] lease seconds,
-- [3..7] reap config (common.lua reap_config).
-- Returns {now, 1, key, token, events} or, when nothing waits,
-- {now, 0, seconds until something comes due ('' if nothing will), events}
-- (a flag, not an empty key, says which: '' is a key like any other).
promote()
reap(reap_config(3))
local key, priority
if ranked then
  key, priority = rank_pop()
else
  key, priority = redis.call('LPOP', FIFO), '0'
  if key then
    redis.call('HDEL', REPUSHED, key)
  end
end
if not key then
  redis.call('DEL', BELL) -- every element left rang for a key already taken
  return { num(now), 0, next_due(), events }
end
local waited = now - tonumber(redis.call('HGET', DIRTY, key))
redis.call('HDEL', DIRTY, key)
local token = redis.call('HINCRBY', STATS, 'seq', 1)
redis.call('ZADD', PROCESSING, num(now + tonumber(ARGV[2])), key)
redis.call('HSET', LEASE, key, table.concat({ token, num(now), priority, 0, '-' }, ' '))
count('gets')
redis.call('HINCRBYFLOAT', STATS, 'queue_wait_seconds', num(waited))
emit('get', key, waited)
return { num(now), 1, key, token, events }
