-- ranked: the ranked waiting set (docs/fairness.md). The queue starts as the
-- FIFO list; the first non-zero priority makes it ranked for good (STATS
-- ranked = 1, and aging, '' for strict), as Core.rank (rank.lua).
--- @include "flags"

-- Ranked (Core.rank): once true, the waiting keys are in RANKED, not FIFO.
-- aging: nil for strict priorities, else seconds per priority step.
local ranked = FLAGS[1] == '1'
local aging = ranked and tonumber(FLAGS[2] or '') or nil

-- The rank of a key of this priority that arrived then: lowest first.
local function score(priority, arrival)
  if aging == nil then
    return -priority
  end
  return arrival - priority * aging
end

-- RankedWaiting.push, without the bell: the key enters the waiting set. Its
-- seq (RANK).
local function rank_push(key, priority, arrival)
  local seq = redis.call('HINCRBY', STATS, 'rank_seq', 1)
  redis.call('ZADD', RANKED, num(score(priority, arrival)), string.format('%016x', seq) .. key)
  redis.call('HSET', RANK, key, priority .. ' ' .. seq)
  redis.call('ZADD', ARRIVALS, num(arrival), key)
  redis.call('HINCRBY', BY_PRIORITY, priority, 1)
  return seq
end

-- A key's priority in PENDING_PRIORITY or DELAYED_PRIORITY: kept if not 0.
local function keep_priority(hash, key, priority)
  if priority ~= 0 then
    redis.call('HSET', hash, key, priority)
  else
    redis.call('HDEL', hash, key)
  end
end

local function unrank(priority)
  if redis.call('HINCRBY', BY_PRIORITY, priority, -1) <= 0 then
    redis.call('HDEL', BY_PRIORITY, priority)
  end
end

-- RankedWaiting.promote_priority (Core.add's touch): a waiting key added with a
-- higher priority moves up, keeping its arrival (and its place among equal
-- scores).
local function promote_priority(key, priority)
  local current, seq = string.match(redis.call('HGET', RANK, key), '^(%S+) (%S+)$')
  if priority <= tonumber(current) then
    return
  end
  local arrival = tonumber(redis.call('ZSCORE', ARRIVALS, key))
  local member = string.format('%016x', tonumber(seq)) .. key
  redis.call('ZADD', RANKED, num(score(priority, arrival)), member)
  redis.call('HSET', RANK, key, priority .. ' ' .. seq)
  unrank(current)
  redis.call('HINCRBY', BY_PRIORITY, priority, 1)
end
