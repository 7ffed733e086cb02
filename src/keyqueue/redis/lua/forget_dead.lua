-- forget_dead: Core.forget_dead: drop a key's dead entry, nothing else.
-- KEYS: dirty processing delayed stats dead dead_info groups
-- ARGV: [1] clock, [2] key.
-- Returns 1 if it had one, else 0.
--- @include "base"
--- @include "dead"
trim_dead() -- an entry past DEAD_MAX_AGE is gone already: 0
redis.call('HDEL', DEAD_INFO, ARGV[2])
local had = redis.call('ZREM', DEAD, ARGV[2])
if had == 1 then
  drop_dead_groups({ ARGV[2] })
end
return had
