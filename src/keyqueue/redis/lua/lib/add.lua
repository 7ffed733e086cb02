-- add: Core.add, the add rule.
--- @include "events"
--- @include "push"

-- Core.add: mark the key dirty; push it only if nobody holds it. 1 if pushed.
-- A key keeps the highest priority it was added with (priority nil: 0).
local function add(key, priority)
  priority = priority or 0
  count('adds')
  if redis.call('HSETNX', DIRTY, key, num(now)) == 0 then
    count('coalesced')
    if ranked then
      if redis.call('HEXISTS', RANK, key) == 1 then
        fair_promote(key, priority)
      elseif priority > tonumber(redis.call('HGET', PENDING_PRIORITY, key) or 0) then
        keep_priority(PENDING_PRIORITY, key, priority)
      end
    end
    emit('coalesce', key)
    return 0
  end
  if redis.call('ZSCORE', PROCESSING, key) then
    count('marked_while_processing')
    if priority ~= 0 then
      redis.call('HSET', PENDING_PRIORITY, key, priority)
    end
    emit('mark_while_processing', key)
    return 0
  end
  count('enqueued')
  push(key, priority)
  emit('enqueue', key)
  return 1
end
