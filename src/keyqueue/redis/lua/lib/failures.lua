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

-- Core.forget, and the server limiter's forget, of a list of keys: the same
-- three commands however many.
local function forget(keys)
  each_of('HDEL', FAILURES, keys)
  each_of('ZREM', FAILING, keys)
  each_of('HDEL', REQUEUES, keys)
end
