-- forget: Core.forget and the server limiter's forget: the key succeeded.
-- Also drops the key's taken-back token (so the memory a key costs ends with
-- its failure history).
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2] token of the caller's
-- hold ('' for none: unfenced), [3] request seq, [4] key.
-- Returns {now, 0, events, status} (status: common.lua fence).
local key, token, seq = ARGV[4], ARGV[2], ARGV[3]
local status, result = fence(key, token, seq)
if status ~= 'ok' then
  return fenced_reply(status, result)
end
forget(key)
redis.call('HDEL', TAKEN_BACK, key)
settled(key, token, seq, 0)
return fenced_reply('ok', 0)
