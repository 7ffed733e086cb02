-- failures: Core.record_failure and Core.forget (max_retries' counts, and
-- Core.failing: every key's failures until its forget, most first, for a
-- snapshot), with the server limiter's forget.
--- @include "base"

-- Core.record_failure: false once the key has failed max_retries times
-- (max_retries is '' for none: never gives up, counts nothing for it).
local function record_failure(key, max_retries)
  redis.call('ZINCRBY', FAILING, 1, key)
  if max_retries == '' then
    return true
  end
  return redis.call('HINCRBY', FAILURES, key, 1) < tonumber(max_retries)
end

-- Core.forget, and the server limiter's forget, of one key or many: the same
-- three commands however many.
local function forget(...)
  redis.call('HDEL', FAILURES, ...)
  redis.call('ZREM', FAILING, ...)
  redis.call('HDEL', REQUEUES, ...)
end
