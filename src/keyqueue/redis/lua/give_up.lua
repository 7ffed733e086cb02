-- give_up: Core.give_up: forget (lua/forget.lua) and keep the key as dead
-- (lib/dead.lua), with the failures it had (FAILING, before the forget).
-- KEYS: dirty processing lease delayed failures requeues stats taken_back
--   failing stalls dead dead_info groups
-- ARGV: [1] clock, [2] token of the caller's hold ('' for none: unfenced),
-- [3] request seq, [4] key, [5] reason, [6] error type ('' for no error),
-- [7] error message, [8] the key's group (a fair_by client's; absent
-- otherwise), kept for its replay if the server has none (a key given up
-- by hand that was never added).
-- Returns {now, 0, events, status} (status: lib/fence.lua).
-- Unfenced, from a sharded client: the error MAPCHANGED, or KEYMOVED (its key
-- moves and is not held here), nothing changed (lib/map.lua, as forget.lua).
--- @include "fence"
--- @include "failures"
--- @include "dead"
--- @include "map"
if CLIENT_EPOCH and ARGV[2] == '' then
  local map = redis.call('HMGET', STATS, 'map_epoch', 'map_shards', 'map_from')
  local refused = map_changed(map[1], map[2], map[3])
    or (KEY_MOVES and moved_away(redis.call('HEXISTS', LEASE, ARGV[4]) == 1))
  if refused then
    return refused
  end
end
return fenced(function(key)
  local failures = redis.call('ZSCORE', FAILING, key)
  forget({ key })
  redis.call('HDEL', TAKEN_BACK, key)
  if (fenced_run == nil or had_stalled(fenced_run)) and redis.call('HDEL', STALLS, key) == 1 then
    redis.call('HINCRBY', STATS, 'stalled_keys', -1)
  end
  if ARGV[8] then
    redis.call('HSETNX', GROUPS, key, ARGV[8])
  end
  bury(key, failures, ARGV[5], ARGV[6], ARGV[7])
  redis.call('HSETNX', STATS, 'seq', 0) -- a key given up used the queue: it exists (STATS)
  return 0
end)
