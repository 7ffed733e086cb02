-- handout: Core.get for one key or many: the waiting keys taken (the FIFO's
-- oldest, or once ranked the first ranked), each with a lease and a fencing
-- token, and how long a getter may wait when none is waiting.
--
-- Token epochs (redis/_epoch.py). A client of a Sentinel service or a
-- Cluster sends its view of the primary with each hand-out: the epoch of
-- the layer that decides failovers (Sentinel's config-epoch, the node's
-- cluster_my_epoch) shifted to its token base, epoch * 2^32, and the
-- replication id of the node it verified was the primary at that epoch. The
-- node hands out only if it is a primary with that replication id (a
-- promotion gives the promoted node a new one; a demoted node reports its
-- primary's, as a replica): else nothing changes and the script answers the
-- error STALEEPOCH. Tokens then start at the base: seq is raised to it
-- first, never lowered (it travels with the data, so a queue whose data
-- moved to a node of a lower epoch keeps counting up). A plain server's
-- client sends no view: no check, seq as it is.
--- @include "events"
--- @include "lease"
--- @include "fair"
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

-- The client's view, if it sent one (ARGV[at]: the token base, ARGV[at + 1]:
-- the replication id): nil to go on, or the STALEEPOCH error reply to
-- return before anything is written. Sets view_base for hand_out.
local view_base = nil
local function check_view(at)
  local base, replid = ARGV[at], ARGV[at + 1]
  if not replid then
    return nil
  end
  local info = redis.call('INFO', 'replication')
  local role = string.match(info, 'role:(%a+)')
  local id = string.match(info, 'master_replid:(%x+)')
  if role ~= 'master' or id ~= replid then
    return redis.error_reply('STALEEPOCH this node is not the primary the client verified (role '
      .. tostring(role) .. ', replication id ' .. tostring(id) .. '): nothing was handed out')
  end
  view_base = base
  return nil
end

-- A hand-out's tokens start at the view's base: seq raised to it (as a
-- string: a Lua number would be written in 14 digits).
local function raise_seq()
  local seq = redis.call('HGET', STATS, 'seq')
  if not seq or tonumber(seq) < tonumber(view_base) then
    redis.call('HSET', STATS, 'seq', view_base)
  end
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
-- HSET of their leases. Tokens are decimal strings (a Lua number's tostring
-- keeps 14 digits; tokens go up to 2^53).
local function hand_out(n, lease, holder, run)
  local keys, priorities = {}, {}
  if ranked then
    for _ = 1, n do
      local key, priority
      if fair then
        key, priority = fair_pop()
      else
        key, priority = rank_pop()
      end
      if not key then
        break
      end
      keys[#keys + 1] = key
      priorities[#keys] = priority
    end
  else
    keys = redis.call('LPOP', FIFO, n) or {}
    if #keys > 0 and redis.call('EXISTS', REPUSHED) == 1 then
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
  if view_base then
    raise_seq()
  end
  local before = redis.call('HINCRBY', STATS, 'seq', taken) - taken
  local expiry, at = num(now + lease), num(now)
  local scores, leases, handed, suspects = {}, {}, {}, {}
  local waited = 0
  for i = 1, taken do
    local key, j = keys[i], 2 * i
    local token = string.format('%d', before + i)
    local wait = now - tonumber(dirty[i])
    local flag = run
    if stalled[i] then
      flag = string.upper(run)
      suspects[#suspects + 1] = key
    end
    waited = waited + wait
    scores[j - 1], scores[j] = expiry, key
    leases[j - 1], leases[j] = key, lease_value(token, at, priorities[i] or '0', 0, '-', holder, flag)
    handed[j - 1], handed[j] = key, token
    emit('get', key, wait)
  end
  redis.call('ZADD', PROCESSING, unpack(scores))
  redis.call('HSET', LEASE, unpack(leases))
  redis.call('HINCRBY', STATS, 'gets', taken)
  redis.call('HINCRBYFLOAT', STATS, 'queue_wait_seconds', num(waited))
  return handed, suspects
end
