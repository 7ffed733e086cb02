-- raise_seq: a reshard's floor under a shard's fencing tokens: seq raised to
-- at least the old shards' (never lowered), before the map that sends keys
-- here without a move is written. A key with no state in its old shard is
-- not exported, so no import raises seq for it: this does.
-- KEYS: stats
-- ARGV: [1] clock (unused), [2] the floor.
-- Returns 1 if seq was raised, else 0.
local seq = redis.call('HGET', STATS, 'seq')
if not seq or tonumber(seq) < tonumber(ARGV[2]) then
  redis.call('HSET', STATS, 'seq', ARGV[2])
  return 1
end
return 0
