-- add_after: Core.add_after (kind 'delay'), and add_rate_limited for a client
-- whose rate limiter is local (kind 'rate_limit', the delay computed there).
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2] key, [3] delay seconds,
-- [4] kind, [5] priority, [6] aging (as add.lua).
-- Returns {now, 1 if pushed now, events}.
local priority = tonumber(ARGV[5])
if priority ~= 0 then
  rank(ARGV[6])
end
promote()
local pushed = add_after(ARGV[2], tonumber(ARGV[3]), ARGV[4], priority)
return { num(now), pushed, events }
