-- add: Core.add, for one key or many.
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2..] keys.
-- Returns {now, how many keys were pushed, events}.
promote()
local pushed = 0
for i = 2, #ARGV do
  pushed = pushed + add(ARGV[i])
end
return { num(now), pushed, events }
