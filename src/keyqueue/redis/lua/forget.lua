-- forget: Core.forget and the server limiter's forget: the key succeeded.
-- Also drops the key's taken-back token and its stall record (so the memory
-- a key costs ends with its failure history; and its stalls in a row end).
-- KEYS: lease failures requeues stats taken_back failing stalls
-- ARGV: [1] clock, [2] token of the caller's hold ('' for none: unfenced),
-- [3] request seq, [4] key.
-- Returns {now, 0, events, status} (status: lib/fence.lua).
-- Unfenced, from a sharded client: the error MAPCHANGED, or KEYMOVED (its key
-- moves and is not held here), nothing changed (lib/map.lua).
--- @include "fence"
--- @include "failures"
--- @include "map"
if CLIENT_EPOCH and ARGV[2] == '' then -- unfenced (as add_after.lua)
  local map = redis.call('HMGET', STATS, 'map_epoch', 'map_shards', 'map_from')
  local refused = map_changed(map[1], map[2], map[3])
    or (KEY_MOVES and moved_away(redis.call('HEXISTS', LEASE, ARGV[4]) == 1))
  if refused then
    return refused
  end
end
return fenced(function(key)
  forget({ key })
  redis.call('HDEL', TAKEN_BACK, key)
  -- Its stall record: known from the caller's hold (lib/lease.lua's run);
  -- looked for only when the caller holds nothing.
  if (fenced_run == nil or had_stalled(fenced_run)) and redis.call('HDEL', STALLS, key) == 1 then
    redis.call('HINCRBY', STATS, 'stalled_keys', -1)
  end
  return 0
end)
