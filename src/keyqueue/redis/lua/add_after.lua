-- add_after: Core.add_after (kind 'delay'), and add_rate_limited for a client
-- whose rate limiter is local (kind 'rate_limit', the delay computed there).
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2] token of the caller's
-- hold of the key ('' for none: unfenced), [3] request seq, [4] key, [5] delay
-- seconds, [6] kind, [7] priority, [8] aging (as add.lua).
-- Returns {now, 1 if pushed now, events, status} (status: common.lua fence;
-- on 'lost' nothing changed).
local key, token, seq = ARGV[4], ARGV[2], ARGV[3]
local status, result = fence(key, token, seq)
if status ~= 'ok' then
  return fenced_reply(status, result)
end
local priority = tonumber(ARGV[7])
if priority ~= 0 then
  rank(ARGV[8])
end
promote()
local pushed = add_after(key, tonumber(ARGV[5]), ARGV[6], priority)
settled(key, token, seq, pushed)
return fenced_reply('ok', pushed)
