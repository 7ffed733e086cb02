-- release: Core.done's release of a hold, of one key or many.
--- @include "events"
--- @include "push"

-- A released key that was added while held waits again (pushed once).
local function redeliver(key)
  if ranked then
    push(key, tonumber(redis.call('HGET', PENDING_PRIORITY, key) or 0))
    redis.call('HDEL', PENDING_PRIORITY, key)
  else
    push(key)
    redis.call('HSET', REPUSHED, key, num(now))
  end
  count('redeliveries')
end

-- A fair queue's released key that is gone (not delayed, not dead) loses its
-- group (lib/fair.lua).
local function drop_group(key)
  if fair and not redis.call('ZSCORE', DELAYED, key) and not redis.call('ZSCORE', DEAD, key) then
    redis.call('HDEL', GROUPS, key)
  end
end

-- Core.done, for a holder whose token matched: processing -> absent, or
-- processing + pending -> waiting (pushed once). True if pushed. keep_group:
-- the caller adds the key again or keeps it as dead (reap): its group stays.
local function release(key, keep_group)
  redis.call('ZREM', PROCESSING, key)
  redis.call('HDEL', LEASE, key)
  if redis.call('HEXISTS', DIRTY, key) == 1 then
    redeliver(key)
    return true
  end
  if not keep_group then
    drop_group(key)
  end
  return false
end

-- release for many keys at once, each emitting 'redeliver' if pushed: the
-- same few commands however many there are.
local function release_many(keys)
  each_of('ZREM', PROCESSING, keys)
  each_of('HDEL', LEASE, keys)
  local dirty = each_of('HMGET', DIRTY, keys)
  for i, key in ipairs(keys) do
    if dirty[i] then
      redeliver(key)
      emit('redeliver', key)
    elseif fair then
      drop_group(key)
    end
  end
end
