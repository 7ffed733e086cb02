-- add: Core.add, for one key or many, all with one priority.
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2] priority, [3] aging
-- ('' for strict: the client's, stored when the queue becomes ranked),
-- [4..] keys. Returns {now, how many keys were pushed, events}.
local priority = tonumber(ARGV[2])
if priority ~= 0 then
  rank(ARGV[3])
end
promote()
local pushed = 0
for i = 4, #ARGV do
  pushed = pushed + add(ARGV[i], priority)
end
return { num(now), pushed, events }
