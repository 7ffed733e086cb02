-- release: Core.done's release of a hold.
--- @include "push"

-- Core.done, for a holder whose token matched: processing -> absent, or
-- processing + pending -> waiting (pushed once).
local function release(key)
  redis.call('ZREM', PROCESSING, key)
  redis.call('HDEL', LEASE, key)
  if redis.call('HEXISTS', DIRTY, key) == 1 then
    if ranked then
      push(key, tonumber(redis.call('HGET', PENDING_PRIORITY, key) or 0))
      redis.call('HDEL', PENDING_PRIORITY, key)
    else
      push(key)
      redis.call('HSET', REPUSHED, key, num(now))
    end
    count('redeliveries')
    return true
  end
  return false
end
