-- summary: Core.stats, the queue-wide counters and sizes (stats runs promote
-- and reap first; snapshot does not).
--- @include "ranked"

-- {now, counters (HGETALL stats), depth, processing, delayed, dirty, events,
-- waiting keys by priority (HGETALL by_priority; {} before the queue is
-- ranked: then all depth keys are at 0), when the waiting key that arrived
-- first arrived ('' if none waits)}. events: the caller's list (lib/events).
local function summary(events)
  local depth, by_priority, oldest
  if ranked then
    depth = redis.call('ZCARD', RANKED)
    by_priority = redis.call('HGETALL', BY_PRIORITY)
    oldest = redis.call('ZRANGE', ARRIVALS, 0, 0, 'WITHSCORES')[2] or ''
  else
    depth = redis.call('LLEN', FIFO)
    by_priority = {}
    local head = redis.call('LINDEX', FIFO, 0)
    oldest = head and (redis.call('HGET', REPUSHED, head) or redis.call('HGET', DIRTY, head)) or ''
  end
  return {
    num(now),
    redis.call('HGETALL', STATS),
    depth,
    redis.call('ZCARD', PROCESSING),
    redis.call('ZCARD', DELAYED),
    redis.call('HLEN', DIRTY),
    events,
    by_priority,
    oldest,
  }
end
