-- forget: Core.forget and the server limiter's forget: the key succeeded.
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2] key.
-- Returns {now, events}.
forget(ARGV[2])
return { num(now), events }
