-- add_rate_limited: record a failure with the server rate limiter and
-- add_after the key by its when() (Front.add_rate_limited with the limiter
-- transcribed: its state is in KEYS requeues, bucket and endpoints, shared
-- by all).
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2] token of the caller's
-- hold of the key ('' for none: unfenced), [3] request seq, [4] key, [5] base,
-- [6] cap, [7] qps, [8] burst, [9] priority, [10] aging (as add.lua),
-- [11] endpoint, [12] endpoint qps ('' for no endpoint), [13] endpoint burst,
-- [14] max endpoints. Returns {now, 1 if pushed now, events, status} (status:
-- common.lua fence; on 'lost' nothing changed).
local key, token, seq = ARGV[4], ARGV[2], ARGV[3]
local status, result = fence(key, token, seq)
if status ~= 'ok' then
  return fenced_reply(status, result)
end
local priority = tonumber(ARGV[9])
if priority ~= 0 then
  rank(ARGV[10])
end
promote()
local limiter = { ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[11], ARGV[12], ARGV[13], ARGV[14] }
local pushed = add_after(key, when(key, limiter), 'rate_limit', priority)
settled(key, token, seq, pushed)
return fenced_reply('ok', pushed)
