-- handout: Core.get for one key or many: the waiting keys taken (the FIFO's
-- oldest, or once ranked the first ranked), each with a lease and a fencing
-- token, and how long a getter may wait when none is waiting.
--- @include "events"
--- @include "lease"
--- @include "ranked"
--- @include "stalls"

-- RankedWaiting.pop, for Core.get: the waiting key ranked first and its
-- priority, or nil.
local function rank_pop()
  local popped = redis.call('ZPOPMIN', RANKED)
  if #popped == 0 then
    return nil
  end
  local key = string.sub(popped[1], 17)
  local priority = string.match(redis.call('HGET', RANK, key), '^(%S+)')
  unrank(priority)
  redis.call('HDEL', RANK, key)
  redis.call('ZREM', ARRIVALS, key)
  return key, priority
end

-- Seconds until the next delayed key comes due or the next lease expires
-- ('' if neither): how long a getter may block before something is owed.
local function next_due()
  local first = redis.call('ZRANGE', DELAYED, 0, 0, 'WITHSCORES')
  local lease = redis.call('ZRANGE', PROCESSING, 0, 0, 'WITHSCORES')
  local at = first[2] and tonumber(first[2])
  if lease[2] and (not at or tonumber(lease[2]) < at) then
    at = tonumber(lease[2])
  end
  if not at then
    return ''
  end
  return num(at - now)
end

-- Core.get up to n times, in one go: the keys taken (oldest or first ranked
-- first) as a flat list of key, token; each leased for lease seconds and
-- recorded with holder and run ('s': its handler starts now, as a get's;
-- 'u': not yet, as a claim's, until the client reports it: lib/lease.lua).
-- Also returns the keys among them that have a stall record (STALLS: their
-- last holder died holding them, with its handler started or not): a claimant
-- reports such a key's start before its handler runs. A few commands for all
-- of them, not per key: one LPOP, one read and one delete of their dirty
-- times, one read of their stall records, one token range, one ZADD and one
-- HSET of their leases.
local function hand_out(n, lease, holder, run)
  local keys, priorities = {}, {}
  if ranked then
    for _ = 1, n do
      local key, priority = rank_pop()
      if not key then
        break
      end
      keys[#keys + 1] = key
      priorities[#keys] = priority
    end
  else
    keys = redis.call('LPOP', FIFO, n) or {}
    if #keys > 0 then
      redis.call('HDEL', REPUSHED, unpack(keys))
    end
  end
  local taken = #keys
  if taken == 0 then
    return keys, {}
  end
  local dirty = redis.call('HMGET', DIRTY, unpack(keys))
  redis.call('HDEL', DIRTY, unpack(keys))
  local stalled = have_records(keys)
  local last = redis.call('HINCRBY', STATS, 'seq', taken)
  local expiry, at = num(now + lease), num(now)
  local scores, leases, handed, suspects = {}, {}, {}, {}
  local waited = 0
  for i, key in ipairs(keys) do
    local token = last - taken + i
    local wait = now - tonumber(dirty[i])
    local flag = run
    if stalled[i] then
      flag = string.upper(run)
      suspects[#suspects + 1] = key
    end
    waited = waited + wait
    scores[2 * i - 1], scores[2 * i] = expiry, key
    leases[2 * i - 1], leases[2 * i] = key, lease_value(token, at, priorities[i] or '0', 0, '-', holder, flag)
    handed[2 * i - 1], handed[2 * i] = key, token
    emit('get', key, wait)
  end
  redis.call('ZADD', PROCESSING, unpack(scores))
  redis.call('HSET', LEASE, unpack(leases))
  redis.call('HINCRBY', STATS, 'gets', taken)
  redis.call('HINCRBYFLOAT', STATS, 'queue_wait_seconds', num(waited))
  return handed, suspects
end
