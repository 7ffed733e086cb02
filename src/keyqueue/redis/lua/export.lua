-- export: a reshard's first step for one key, on its old shard: the key's
-- whole state taken out in one step (its dirty time, waiting entry and
-- priority, delayed entry as the delay left, failures, requeues, failing
-- count, taken-back token, stall record, group) with the shard's seq, and kept in
-- MOVING until finish.lua drops it. Refused for a held key: it stays until
-- its holder is done. Asked again (a mover or client that died, a second
-- client), it answers the state kept.
-- KEYS: dirty fifo processing delayed delay_seq failures requeues stats
--   taken_back repushed ranked rank arrivals by_priority pending_priority
--   delayed_priority failing stalls groups fair_keys fair_turns fair_turn_of
--   moving
-- ARGV: [1] clock (with the client's map: lib/map.lua), [2] key.
-- Returns {now, 'held'} or {now, 'moved', the state as JSON}; {now,
-- 'behind'} if this shard has an older map than the client (the mover has
-- not written it here yet: a client with that older map could still give
-- the key state here after it left), nothing changed: the client writes its
-- map here (set_map.lua) and asks again; or the error MAPCHANGED, nothing
-- changed.
--- @include "fair"
--- @include "stalls"
--- @include "map"
local refused = map_changed(FLAGS[4], FLAGS[5], FLAGS[6])
if refused then
  return refused
end
if tonumber(FLAGS[4] or 0) < (CLIENT_EPOCH or 0) then
  return { num(now), 'behind' }
end
local key = ARGV[2]
local kept = redis.call('HGET', MOVING, key)
if kept then
  return { num(now), 'moved', kept }
end
if redis.call('ZSCORE', PROCESSING, key) then
  return { num(now), 'held' }
end

-- Take field's value of the key out of hash (nil if none).
local function take(hash, name)
  local value = redis.call('HGET', hash, name)
  if value then
    redis.call('HDEL', hash, name)
  end
  return value or nil
end

local state = { seq = redis.call('HGET', STATS, 'seq') or '0' }
state.dirty = take(DIRTY, key)
if state.dirty then -- dirty and not held: it waits
  local rank = take(RANK, key)
  if rank then
    local priority, seq = string.match(rank, '^(%S+) (%S+)$')
    redis.call('ZREM', RANKED, string.format('%016x', tonumber(seq)) .. key)
    fair_remove(key, priority, seq)
    state.arrival = redis.call('ZSCORE', ARRIVALS, key) or nil
    redis.call('ZREM', ARRIVALS, key)
    unrank(priority)
    state.priority = priority
  else
    redis.call('LREM', FIFO, 1, key)
    state.arrival = take(REPUSHED, key)
  end
end
redis.call('HDEL', PENDING_PRIORITY, key)
local ready = redis.call('ZSCORE', DELAYED, key)
if ready then
  state.delay = num(tonumber(ready) - now)
  state.delayed_priority = take(DELAYED_PRIORITY, key)
  redis.call('ZREM', DELAYED, key)
  redis.call('HDEL', DELAY_SEQ, key)
end
state.failures = take(FAILURES, key)
state.requeues = take(REQUEUES, key)
state.failing = redis.call('ZSCORE', FAILING, key) or nil
redis.call('ZREM', FAILING, key)
state.taken_back = take(TAKEN_BACK, key)
state.stalls = take(STALLS, key)
if state.stalls then
  count_records(-1)
end
state.group = take(GROUPS, key)
local encoded = cjson.encode(state)
redis.call('HSET', MOVING, key, encoded)
return { num(now), 'moved', encoded }
