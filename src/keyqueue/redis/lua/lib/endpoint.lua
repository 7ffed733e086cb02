-- endpoint: the server limiter's EndpointRateLimiter, one bucket per endpoint
-- a key names, and when() with it.
--- @include "limiter"

-- EndpointRateLimiter.when: the bucket of one endpoint (starting full), the
-- least recently used endpoint dropped beyond max_endpoints.
local function endpoint_when(name, qps, burst, max_endpoints)
  local tokens, last = burst, nil
  local state = redis.call('HGET', ENDPOINTS, name)
  if state then
    local t, l = string.match(state, '^(%S+) (%S+)$')
    tokens, last = tonumber(t), tonumber(l)
  end
  local delay
  tokens, last, delay = take(tokens, last, qps, burst)
  redis.call('HSET', ENDPOINTS, name, num(tokens) .. ' ' .. num(last))
  redis.call('ZADD', ENDPOINT_LRU, redis.call('HINCRBY', STATS, 'endpoint_seq', 1), name)
  if redis.call('ZCARD', ENDPOINT_LRU) > max_endpoints then
    redis.call('HDEL', ENDPOINTS, redis.call('ZPOPMIN', ENDPOINT_LRU)[1])
  end
  return delay
end

-- when(), and then the key's endpoint's bucket when the client named one:
-- limiter is {base, cap, qps, burst, endpoint, endpoint qps, endpoint burst,
-- max endpoints} as strings (endpoint qps '' for none).
local function limited_when(key, limiter)
  local delay = when(key, limiter)
  if limiter[6] and limiter[6] ~= '' then
    local wait = endpoint_when(limiter[5], tonumber(limiter[6]), tonumber(limiter[7]), tonumber(limiter[8]))
    delay = math.max(delay, wait)
  end
  return delay
end
