-- forget_dead: Core.forget_dead: drop a key's dead entry, nothing else.
-- KEYS: stats dead dead_info
-- ARGV: [1] clock, [2] key.
-- Returns 1 if it had one, else 0.
--- @include "base"
redis.call('HDEL', DEAD_INFO, ARGV[2])
return redis.call('ZREM', DEAD, ARGV[2])
