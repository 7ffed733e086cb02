-- add_rate_limited: record a failure with the server rate limiter and
-- add_after the key by its when() (Front.add_rate_limited with the limiter
-- transcribed: its state is in KEYS requeues and bucket, shared by all).
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2] key, [3] base,
-- [4] cap, [5] qps, [6] burst. Returns {now, 1 if pushed now, events}.
promote()
local key = ARGV[2]
local pushed = add_after(key, when(key, { ARGV[3], ARGV[4], ARGV[5], ARGV[6] }), 'rate_limit')
return { num(now), pushed, events }
