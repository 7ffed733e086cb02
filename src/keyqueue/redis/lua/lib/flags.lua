-- flags: what a script reads of the queue's STATS before anything else, in
-- one HMGET: ranked and aging (lib/ranked.lua), how many keys have a
-- stall record (lib/stalls.lua), the shard map's epoch, count and the
-- count a reshard moves from (lib/map.lua), and fair (lib/fair.lua).
--- @include "base"

local FLAGS = redis.call('HMGET', STATS, 'ranked', 'aging', 'stalled_keys', 'map_epoch', 'map_shards',
  'map_from', 'fair')
