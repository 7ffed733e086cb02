-- dead: Core.dead_keys, read only: the first keys given up, newest first.
-- KEYS: stats dead dead_info
-- ARGV: [1] clock, [2] limit (0: none).
-- Returns {keys, when each was given up, each one's entry (JSON)}.
--- @include "base"
local last = tonumber(ARGV[2]) - 1
if last < 0 then
  return { {}, {}, {} }
end
local keys, times = {}, {}
local rows = redis.call('ZRANGE', DEAD, 0, last, 'REV', 'WITHSCORES')
for i = 1, #rows, 2 do
  keys[#keys + 1] = rows[i]
  times[#times + 1] = rows[i + 1]
end
return { keys, times, each_of('HMGET', DEAD_INFO, keys) }
