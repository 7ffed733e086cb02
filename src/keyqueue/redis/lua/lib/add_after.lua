-- add_after: Core.add_after, a delayed add.
--- @include "add"

-- Core.add_after: the key is ready at now + delay; the earliest ready time
-- wins; if that is not later than now (delay <= 0, or a delay too small to
-- move now in floating point) the add rule applies now. kind is 'delay' or
-- 'rate_limit'.
local function add_after(key, delay, kind, priority)
  priority = priority or 0
  count('retries')
  if kind == 'rate_limit' then -- Stats' rate_limited, its delays' sum and longest
    count('rate_limited')
    redis.call('HINCRBYFLOAT', STATS, 'rate_limit_delay_seconds', num(delay))
    if delay > tonumber(redis.call('HGET', STATS, 'max_rate_limit_delay_seconds') or 0) then
      redis.call('HSET', STATS, 'max_rate_limit_delay_seconds', num(delay))
    end
  end
  emit(kind, key, delay)
  if now + delay <= now then
    return add(key, priority)
  end
  if ranked then -- the delayed entry is added with the highest priority asked
    if redis.call('ZSCORE', DELAYED, key) then
      priority = math.max(priority, tonumber(redis.call('HGET', DELAYED_PRIORITY, key) or 0))
    end
    keep_priority(DELAYED_PRIORITY, key, priority)
  end
  local first = redis.call('ZRANGE', DELAYED, 0, 0, 'WITHSCORES')
  if redis.call('ZADD', DELAYED, 'LT', 'CH', num(now + delay), key) == 1 then
    redis.call('HSET', DELAY_SEQ, key, redis.call('HINCRBY', STATS, 'delay_seq', 1))
    if not first[2] or now + delay < tonumber(first[2]) then
      -- The queue's next due time moved earlier: a waiting getter reads it
      -- again and sets its timer (it may wait for a later one).
      ring()
    end
  end
  return 0
end
