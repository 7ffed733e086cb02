-- stats: the queue-wide counters and sizes, after promote and reap.
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2..6] reap config.
-- Returns {now, counters (HGETALL stats), depth, processing, delayed, dirty,
-- events}.
promote()
reap(reap_config(2))
return {
  num(now),
  redis.call('HGETALL', STATS),
  redis.call('LLEN', FIFO),
  redis.call('ZCARD', PROCESSING),
  redis.call('ZCARD', DELAYED),
  redis.call('HLEN', DIRTY),
  events,
}
