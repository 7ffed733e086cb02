-- fair: fair_by on the server (docs/fairness.md, "Fairness within a
-- priority"), FairWaiting's rotation. A queue becomes fair, for good and
-- ranked, at the first add from a client with fair_by (STATS fair = 1); the
-- client computes each key's group and sends it with the key, and GROUPS
-- keeps it (key -> group) while the key is waiting, delayed, held or dead,
-- so a push the server makes alone (done, a delay coming due, reap, replay)
-- knows it. Two sorted sets ordered by member (all scores 0), so each step
-- is a ZRANGE BYLEX of one element, O(log n):
--   FAIR_KEYS   "<priority> <#group> <group><seq, 16 hex digits><key>": each
--               waiting key in its group's keys at its priority, by arrival;
--   FAIR_TURNS  "<priority> <turn, 16 hex digits><#group> <group>": the groups
--               with keys waiting at a priority, in turn order;
-- and FAIR_TURN_OF ("<priority> <#group> <group>" -> its FAIR_TURNS member).
-- The length before a group makes every prefix name exactly one group, and
-- members are binary-safe. Invariant: every key in RANKED has its member in
-- FAIR_KEYS, every (priority, group) there has one turn; the pop still skips
-- a member whose key's RANK no longer matches and falls back to RANKED's
-- first key if its priority has no turn (a key ranked by a client without
-- fair_by), so a stale member never hands out a key twice.
--- @include "ranked"

local fair = FLAGS[7] == '1'

-- The prefix of a group's members at a priority (FAIR_KEYS, FAIR_TURN_OF).
local function group_at(priority, group)
  return priority .. ' ' .. #group .. ' ' .. group
end

-- The first member of FAIR_KEYS or FAIR_TURNS starting with prefix (prefixes
-- here are followed by hex digits only), or nil.
local function first_with(zset, prefix)
  return redis.call('ZRANGE', zset, '[' .. prefix, '(' .. prefix .. 'g', 'BYLEX', 'LIMIT', 0, 1)[1]
end

-- A group's turn at a priority, at the back of the rotation there.
local function to_back(priority, at)
  local turn = priority .. ' ' .. string.format('%016x', redis.call('HINCRBY', STATS, 'fair_turn', 1))
    .. string.sub(at, #tostring(priority) + 2)
  redis.call('ZADD', FAIR_TURNS, 0, turn)
  redis.call('HSET', FAIR_TURN_OF, at, turn)
end

-- FairWaiting.join: the key (RANK seq) joins its group's keys at priority; a
-- group with none waiting there joins the rotation at the back.
local function fair_join(key, priority, seq, group)
  local at = group_at(priority, group)
  redis.call('ZADD', FAIR_KEYS, 0, at .. string.format('%016x', tonumber(seq)) .. key)
  if redis.call('HEXISTS', FAIR_TURN_OF, at) == 0 then
    to_back(priority, at)
  end
end

-- The key leaves its group's keys at priority; a group left with none there
-- leaves the rotation (FairWaiting.leave).
local function fair_leave(key, priority, seq, group)
  local at = group_at(priority, group)
  redis.call('ZREM', FAIR_KEYS, at .. string.format('%016x', tonumber(seq)) .. key)
  if not first_with(FAIR_KEYS, at) then
    local turn = redis.call('HGET', FAIR_TURN_OF, at)
    if turn then
      redis.call('ZREM', FAIR_TURNS, turn)
      redis.call('HDEL', FAIR_TURN_OF, at)
    end
  end
end

local function group_of(key)
  return redis.call('HGET', GROUPS, key) or ''
end

-- A waiting key's priority and seq (RANK), or nil.
local function rank_of(key)
  local value = redis.call('HGET', RANK, key)
  if not value then
    return nil
  end
  return string.match(value, '^(%S+) (%S+)$')
end

-- FairWaiting.promote_priority (ranked's promote_priority with the turns): a
-- waiting key moved up joins its group's keys at the new priority by its
-- arrival; its group leaves the old one's rotation if it has none left there.
local function fair_promote(key, priority)
  if not fair then
    return promote_priority(key, priority)
  end
  local current, seq = rank_of(key)
  if priority <= tonumber(current) then
    return
  end
  promote_priority(key, priority)
  local group = group_of(key)
  fair_leave(key, current, seq, group)
  fair_join(key, priority, seq, group)
end

-- A waiting key taken out (a reshard's export): its member and turn go too.
local function fair_remove(key, priority, seq)
  if fair then
    fair_leave(key, priority, seq, group_of(key))
  end
end

-- FairWaiting.pop, for Core.get: RANKED's first key names the priority; the
-- first key of the group whose turn it is there is taken out of the waiting
-- set, and the group goes to the back if it has keys left there. The key
-- and its priority, or nil if none waits.
local function fair_pop()
  local head = redis.call('ZRANGE', RANKED, 0, 0)[1]
  if not head then
    return nil
  end
  local head_key = string.sub(head, 17)
  local priority = rank_of(head_key)
  local key, seq = head_key, string.sub(head, 1, 16)
  while true do
    local turn = first_with(FAIR_TURNS, priority .. ' ')
    if not turn then -- no turn at this priority: RANKED's first key
      key, seq = head_key, string.sub(head, 1, 16)
      break
    end
    local at = priority .. ' ' .. string.sub(turn, #priority + 18)
    local member = first_with(FAIR_KEYS, at)
    redis.call('ZREM', FAIR_TURNS, turn)
    if member then
      redis.call('ZREM', FAIR_KEYS, member)
      if first_with(FAIR_KEYS, at) then
        to_back(priority, at)
      else
        redis.call('HDEL', FAIR_TURN_OF, at)
      end
      seq = string.sub(member, #at + 1, #at + 16)
      key = string.sub(member, #at + 17)
      local _, held = rank_of(key)
      if held and tonumber(held) == tonumber(seq, 16) then
        break
      end
    else
      redis.call('HDEL', FAIR_TURN_OF, at)
    end
  end
  redis.call('ZREM', RANKED, seq .. key)
  redis.call('HDEL', RANK, key)
  redis.call('ZREM', ARRIVALS, key)
  unrank(priority)
  return key, priority
end
