-- rank: Core.rank, the switch from the FIFO list to the ranked set.
--- @include "fair"

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

-- The queue becomes fair (lib/fair.lua), for good, and ranked: the keys
-- waiting join their groups' keys (GROUPS, '' for a key no group was sent
-- for), in rank order.
local function make_fair(aging_arg)
  if fair then
    return
  end
  rank(aging_arg)
  fair = true
  redis.call('HSET', STATS, 'fair', 1)
  for _, member in ipairs(redis.call('ZRANGE', RANKED, 0, -1)) do
    local key = string.sub(member, 17)
    local priority, seq = rank_of(key)
    fair_join(key, priority, seq, group_of(key))
  end
end

-- The groups a fair client sent (cjson list, '' from a client without
-- fair_by) kept for keys (GROUPS); the queue becomes fair at the first.
local function keep_groups(groups_arg, keys, aging_arg)
  if groups_arg == nil or groups_arg == '' then
    return
  end
  make_fair(aging_arg)
  local groups = cjson.decode(groups_arg)
  local fields = {}
  for i, key in ipairs(keys) do
    fields[#fields + 1] = key
    fields[#fields + 1] = groups[i]
  end
  each_of('HSET', GROUPS, fields)
end
