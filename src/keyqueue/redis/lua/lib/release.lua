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

-- Core.done, for a holder whose token matched: processing -> absent, or
-- processing + pending -> waiting (pushed once). True if pushed.
local function release(key)
  redis.call('ZREM', PROCESSING, key)
  redis.call('HDEL', LEASE, key)
  if redis.call('HEXISTS', DIRTY, key) == 1 then
    redeliver(key)
    return true
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
    end
  end
end
