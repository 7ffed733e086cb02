-- reap: expired leases taken back, as their holders' done and one failure.
--- @include "promote"
--- @include "add_after"
--- @include "failures"
--- @include "limiter"
--- @include "lease"
--- @include "release"

-- reap: every lease expired by now ends as its holder's done would, then
-- counts as one failure of the key: retried through the rate limiter (the add
-- rule, after the backoff), or given up at max_retries (then forgotten). The
-- token is remembered in TAKEN_BACK so the late holder's done raises LeaseLost.
-- limiter is {base, cap, qps, burst}, or {} for a client whose limiter is
-- local: then the key is added again at once.
local function reap(max_retries, limiter)
  local expired = redis.call('ZRANGEBYSCORE', PROCESSING, '-inf', num(now), 'LIMIT', 0, BATCH)
  for _, key in ipairs(expired) do
    local token, started = lease_of(key)
    redis.call('HSET', TAKEN_BACK, key, token)
    count('leases_expired')
    emit('lease_expired', key, now - tonumber(started))
    if release(key) then
      emit('redeliver', key)
    end
    if record_failure(key, max_retries) then
      add_after(key, #limiter > 0 and when(key, limiter) or 0, 'rate_limit')
    else
      forget({ key })
      emit('give_up', key)
    end
  end
end

-- The reap configuration every reaping script takes after its own ARGV:
-- max_retries, then base, cap, qps, burst (all '' for a local limiter).
local function reap_config(first)
  local limiter = {}
  if ARGV[first + 1] ~= '' then
    limiter = { ARGV[first + 1], ARGV[first + 2], ARGV[first + 3], ARGV[first + 4] }
  end
  return ARGV[first], limiter
end
