-- add_rate_limited: record a failure with the server rate limiter and
-- add_after the key by its when() (Front.add_rate_limited with the limiter
-- transcribed: its state is in KEYS requeues, bucket and endpoints, shared
-- by all).
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2] key, [3] base,
-- [4] cap, [5] qps, [6] burst, [7] priority, [8] aging (as add.lua),
-- [9] endpoint, [10] endpoint qps ('' for no endpoint), [11] endpoint burst,
-- [12] max endpoints. Returns {now, 1 if pushed now, events}.
local priority = tonumber(ARGV[7])
if priority ~= 0 then
  rank(ARGV[8])
end
promote()
local key = ARGV[2]
local limiter = { ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[9], ARGV[10], ARGV[11], ARGV[12] }
local pushed = add_after(key, when(key, limiter), 'rate_limit', priority)
return { num(now), pushed, events }
