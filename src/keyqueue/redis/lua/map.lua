-- map: a sharded queue's map as shard 0 keeps it, the authority (every
-- shard keeps a copy of the epoch for its own scripts: lib/map.lua). A
-- queue not on the server yet gets the asked count at epoch 1 (an
-- unsharded client, epoch 0, is refused by it); a queue with state and no
-- map is one shard at epoch 0, as made by unsharded clients: kept so.
-- KEYS: stats
-- ARGV: [1] clock (unused), [2] the shards a new queue has.
-- Returns {shards, epoch, the shards being moved from ('' if none)}.
local map = redis.call('HMGET', STATS, 'map_shards', 'map_epoch', 'map_from')
if map[2] then
  return { map[1], map[2], map[3] or '' }
end
if redis.call('EXISTS', STATS) == 1 then
  return { '1', '0', '' }
end
redis.call('HSET', STATS, 'map_shards', ARGV[2], 'map_epoch', 1)
return { ARGV[2], '1', '' }
