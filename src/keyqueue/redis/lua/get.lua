-- get: Core.get (the FIFO's oldest, or once ranked the first ranked), with a
-- lease and a fencing token. Runs promote and reap first, so any client's get
-- releases due keys and expired leases.
-- KEYS: dirty fifo processing lease delayed delay_seq failures requeues bucket
--   stats bell taken_back repushed ranked rank arrivals by_priority
--   pending_priority delayed_priority failing
-- ARGV: [1] clock, [2] lease seconds, [3..7] reap config (lib/reap.lua
-- reap_config), [8] the caller's holder identity (recorded with the lease).
-- Returns {now, 1, key, token, events} or, when nothing waits,
-- {now, 0, seconds until something comes due ('' if nothing will), events}
-- (a flag, not an empty key, says which: '' is a key like any other).
--- @include "promote"
--- @include "reap"
--- @include "ranked"

-- RankedWaiting.pop, for Core.get: the waiting key ranked first and its
-- priority, or nil.
local function rank_pop()
  local popped = redis.call('ZPOPMIN', RANKED)
  if #popped == 0 then
    return nil
  end
  local key = string.sub(popped[1], 17)
  local priority = string.match(redis.call('HGET', RANK, key), '^(%S+)')
  unrank(priority)
  redis.call('HDEL', RANK, key)
  redis.call('ZREM', ARRIVALS, key)
  return key, priority
end

-- Seconds until the next delayed key comes due or the next lease expires
-- ('' if neither): how long a getter may block before something is owed.
local function next_due()
  local first = redis.call('ZRANGE', DELAYED, 0, 0, 'WITHSCORES')
  local lease = redis.call('ZRANGE', PROCESSING, 0, 0, 'WITHSCORES')
  local at = first[2] and tonumber(first[2])
  if lease[2] and (not at or tonumber(lease[2]) < at) then
    at = tonumber(lease[2])
  end
  if not at then
    return ''
  end
  return num(at - now)
end

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
  redis.call('HSETNX', STATS, 'seq', 0) -- a getter used the queue: it exists (STATS)
  return { num(now), 0, next_due(), events }
end
local waited = now - tonumber(redis.call('HGET', DIRTY, key))
redis.call('HDEL', DIRTY, key)
local token = redis.call('HINCRBY', STATS, 'seq', 1)
redis.call('ZADD', PROCESSING, num(now + tonumber(ARGV[2])), key)
redis.call('HSET', LEASE, key, lease_value(token, num(now), priority, 0, '-', ARGV[8]))
count('gets')
redis.call('HINCRBYFLOAT', STATS, 'queue_wait_seconds', num(waited))
emit('get', key, waited)
return { num(now), 1, key, token, events }
