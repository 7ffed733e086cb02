-- import: a reshard's second step for one key, on its new shard: the state
-- export.lua took out of its old shard, merged by the add rule with what is
-- here (dirty once, the highest priority, the earliest delay, the larger
-- counts), after raising the shard's seq to at least the old shard's, so
-- every later token of the key is above all its earlier ones. Once per key
-- and reshard (IMPORTED, the reshard's epoch): asked again, it changes
-- nothing.
-- KEYS: dirty fifo processing delayed delay_seq failures requeues stats bell
--   taken_back repushed ranked rank arrivals by_priority pending_priority
--   delayed_priority failing stalls groups fair_keys fair_turns fair_turn_of
--   imported
-- ARGV: [1] clock (with the client's map: lib/map.lua), [2] key, [3] the
-- state (export.lua's JSON), [4] aging (as add.lua).
-- Returns {now, 'ok'} or {now, 'repeat'}; or the error MAPCHANGED, nothing
-- changed.
--- @include "rank"
--- @include "push"
--- @include "stalls"
--- @include "map"
local refused = map_changed(FLAGS[4], FLAGS[5], FLAGS[6])
if refused then
  return refused
end
local key = ARGV[2]
if redis.call('HGET', IMPORTED, key) == tostring(CLIENT_EPOCH) then
  return { num(now), 'repeat' }
end
local state = cjson.decode(ARGV[3])

-- hash's field of the key raised to at least value.
local function raise(hash, value)
  if value and tonumber(redis.call('HGET', hash, key) or 0) < tonumber(value) then
    redis.call('HSET', hash, key, value)
  end
end

local seq = redis.call('HGET', STATS, 'seq')
if not seq or tonumber(seq) < tonumber(state.seq) then
  redis.call('HSET', STATS, 'seq', state.seq)
end
raise(FAILURES, state.failures)
raise(REQUEUES, state.requeues)
raise(TAKEN_BACK, state.taken_back)
if state.failing and tonumber(redis.call('ZSCORE', FAILING, key) or 0) < tonumber(state.failing) then
  redis.call('ZADD', FAILING, state.failing, key)
end
if state.stalls and keep_record(key) < tonumber(state.stalls) then
  redis.call('HSET', STALLS, key, state.stalls)
end
if state.group then -- a fair queue's key: this shard is fair too
  keep_groups(cjson.encode({ state.group }), { key }, ARGV[4])
end
if state.delay then
  local priority = tonumber(state.delayed_priority or 0)
  if priority ~= 0 then
    rank(ARGV[4])
    if priority > tonumber(redis.call('HGET', DELAYED_PRIORITY, key) or 0) then
      redis.call('HSET', DELAYED_PRIORITY, key, priority)
    end
  end
  if redis.call('ZADD', DELAYED, 'LT', 'CH', num(now + tonumber(state.delay)), key) == 1 then
    redis.call('HSET', DELAY_SEQ, key, redis.call('HINCRBY', STATS, 'delay_seq', 1))
    ring() -- a waiting getter reads the next due time again
  end
end
if state.dirty then
  local priority = tonumber(state.priority or 0)
  if priority ~= 0 then
    rank(ARGV[4])
  end
  if redis.call('HSETNX', DIRTY, key, state.dirty) == 0 then
    if ranked and redis.call('HEXISTS', RANK, key) == 1 then
      fair_promote(key, priority)
    elseif priority > tonumber(redis.call('HGET', PENDING_PRIORITY, key) or 0) then
      redis.call('HSET', PENDING_PRIORITY, key, priority)
    end
  elseif redis.call('ZSCORE', PROCESSING, key) then
    if priority ~= 0 then
      redis.call('HSET', PENDING_PRIORITY, key, priority)
    end
  else -- it waits here, from when it arrived there
    local arrival = tonumber(state.arrival or state.dirty)
    if ranked then
      local seq = rank_push(key, priority, arrival)
      if fair then
        fair_join(key, priority, seq, group_of(key))
      end
    else
      redis.call('RPUSH', FIFO, key)
      redis.call('HSET', REPUSHED, key, num(arrival))
    end
    ring()
  end
end
redis.call('HSET', IMPORTED, key, CLIENT_EPOCH or 0)
return { num(now), 'ok' }
