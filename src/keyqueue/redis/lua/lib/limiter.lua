-- limiter: the server rate limiter's per-key backoff and its token bucket.
--- @include "base"

-- A token bucket's take (BucketRateLimiter.when): refill since last, take
-- one token, going into debt. Returns tokens, last, and the wait for the debt.
local function take(tokens, last, qps, burst)
  if last ~= nil and now > last then
    tokens = math.min(burst, tokens + (now - last) * qps)
  end
  if last == nil or now > last then
    last = now
  end
  tokens = tokens - 1
  if tokens < 0 then
    return tokens, last, -tokens / qps
  end
  return tokens, last, 0
end

-- The server rate limiter's when(): client-go's default limiter with its
-- state here, shared by every client. The max of
--   ItemExponentialFailureRateLimiter: base * 2^failures, capped (overflow clamped)
--   BucketRateLimiter: qps tokens a second, burst at most, going into debt
--     (rate.Reserve().Delay()); qps '0' means no bucket
-- limiter is {base, cap, qps, burst} as strings (endpoint.lua adds the
-- key's endpoint).
local function when(key, limiter)
  local base, cap = tonumber(limiter[1]), tonumber(limiter[2])
  local qps, burst = tonumber(limiter[3]), tonumber(limiter[4])
  local failures = redis.call('HINCRBY', REQUEUES, key, 1) - 1
  local delay = base * 2 ^ math.min(failures, 1023)
  if not (delay <= cap) then
    delay = cap
  end
  if qps > 0 then
    local tokens = tonumber(redis.call('HGET', BUCKET, 'tokens') or burst)
    local last = tonumber(redis.call('HGET', BUCKET, 'last') or '')
    local wait
    tokens, last, wait = take(tokens, last, qps, burst)
    redis.call('HSET', BUCKET, 'tokens', num(tokens), 'last', num(last))
    if wait > delay then
      delay = wait
    end
  end
  return delay
end
