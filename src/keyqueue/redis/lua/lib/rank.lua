-- rank: Core.rank, the switch from the FIFO list to the ranked set.
--- @include "ranked"

-- Core.rank: the first non-zero priority makes the queue ranked, for good.
-- The waiting keys keep their order and when they arrived (their add, or
-- the done that pushed them back).
local function rank(aging_arg)
  if ranked then
    return
  end
  ranked = true
  aging = tonumber(aging_arg)
  redis.call('HSET', STATS, 'ranked', 1, 'aging', aging_arg)
  for _, key in ipairs(redis.call('LRANGE', FIFO, 0, -1)) do
    rank_push(key, 0, tonumber(redis.call('HGET', REPUSHED, key) or redis.call('HGET', DIRTY, key)))
  end
  redis.call('DEL', FIFO, REPUSHED)
end

-- A script's priority argument as a number: the first non-zero one makes
-- the queue ranked (with the client's aging argument).
local function ranking(priority_arg, aging_arg)
  local priority = tonumber(priority_arg)
  if priority ~= 0 then
    rank(aging_arg)
  end
  return priority
end
