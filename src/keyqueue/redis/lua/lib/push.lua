-- push: a key enters the waiting set, and the doorbell rings.
--- @include "fair"

local BELL_CAP = 1024 -- doorbell elements kept while nobody waits

-- Ring the doorbell: one getter blocked in BLPOP wakes and runs get.
local function ring()
  if redis.call('RPUSH', BELL, 1) > BELL_CAP then
    redis.call('LTRIM', BELL, -BELL_CAP, -1)
  end
end

-- Append to the waiting set (the FIFO, or ranked), the depth high-water mark,
-- and ring the doorbell. A getter blocked in BLPOP is served the bell element
-- at once; elements left when nobody waits are trimmed, and dropped by the
-- next get that finds nothing waiting.
local function push(key, priority)
  local depth
  if ranked then
    local seq = rank_push(key, priority or 0, now)
    if fair then
      fair_join(key, priority or 0, seq, group_of(key))
    end
    depth = redis.call('ZCARD', RANKED)
  else
    depth = redis.call('RPUSH', FIFO, key)
  end
  if depth > tonumber(redis.call('HGET', STATS, 'max_depth') or 0) then
    redis.call('HSET', STATS, 'max_depth', depth)
  end
  ring()
end
