-- finish: a reshard's last step for one key, on its old shard, once
-- import.lua ran: the state export.lua kept is dropped.
-- KEYS: moving
-- ARGV: [1] clock (unused), [2] key.
-- Returns 1 if a state was kept, else 0.
return redis.call('HDEL', MOVING, ARGV[2])
