-- replay: Core.replay and Core.replay_all: each dead key named (or every one,
-- oldest first) loses its entry and its failures, then the add rule
-- (lib/add.lua: a key waiting or held meanwhile is coalesced or marked).
-- KEYS: dirty fifo processing delayed delay_seq failures requeues stats bell
--   repushed ranked rank arrivals by_priority pending_priority delayed_priority
--   failing dead dead_info groups fair_keys fair_turns fair_turn_of
-- ARGV: [1] clock, [2] 'all' or 'keys', [3..] the keys (for 'keys').
-- Returns {now, the keys replayed, how many were pushed, events}.
-- Or the error MAPCHANGED, or KEYMOVED (its key moves and is not held here),
-- nothing changed (lib/map.lua, as add.lua).
--- @include "rank"
--- @include "promote"
--- @include "failures"
--- @include "map"
--- @include "dead"
local refused = map_changed(FLAGS[4], FLAGS[5], FLAGS[6])
  or (KEY_MOVES and moved_away(redis.call('ZSCORE', PROCESSING, ARGV[3])))
if refused then
  return refused
end
promote()
trim_dead() -- an entry past DEAD_MAX_AGE is not replayed
local keys = {}
if ARGV[2] == 'all' then
  keys = redis.call('ZRANGE', DEAD, 0, -1)
else
  for i = 3, #ARGV do
    if redis.call('ZSCORE', DEAD, ARGV[i]) then
      keys[#keys + 1] = ARGV[i]
    end
  end
end
local pushed = 0
if #keys > 0 then
  each_of('ZREM', DEAD, keys)
  each_of('HDEL', DEAD_INFO, keys)
  forget(keys)
  for _, key in ipairs(keys) do
    pushed = pushed + add(key, 0)
  end
end
return { num(now), keys, pushed, events }
