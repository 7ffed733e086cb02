-- set_map: a reshard's change of the map on one shard (shard 0 first, the
-- authority, then every other shard of the old and new maps): the new
-- count, epoch, and the count moved from ('' once every key has moved).
-- Only a higher epoch than the shard's is written, so two movers racing
-- write it once; on shard 0 the mover checks it won (expected epoch).
-- Ending a move drops the shard's IMPORTED marks (no import of that move
-- can run any more: its epoch is refused). A new map rings the doorbell
-- for every client waiting on it (as many elements as the bell keeps): each
-- looks at the shard, is refused for its old map and reads the new one, so
-- an idle client learns of the shards a reshard adds.
-- KEYS: stats bell imported
-- ARGV: [1] clock (unused), [2] shards, [3] epoch, [4] shards moved from
-- ('' for none), [5] the epoch the shard must have ('' for any lower).
-- Returns {1 if written else 0, the shard's epoch before}.
local before = redis.call('HGET', STATS, 'map_epoch') or '0'
if tonumber(before) >= tonumber(ARGV[3]) or (ARGV[5] ~= '' and before ~= ARGV[5]) then
  return { 0, before }
end
redis.call('HSET', STATS, 'map_shards', ARGV[2], 'map_epoch', ARGV[3])
if ARGV[4] == '' then
  redis.call('HDEL', STATS, 'map_from')
  redis.call('DEL', IMPORTED)
else
  redis.call('HSET', STATS, 'map_from', ARGV[4])
end
local rings = {}
for i = 1, 1024 do -- lib/push.lua's BELL_CAP
  rings[i] = 1
end
redis.call('RPUSH', BELL, unpack(rings))
redis.call('LTRIM', BELL, -1024, -1)
return { 1, before }
