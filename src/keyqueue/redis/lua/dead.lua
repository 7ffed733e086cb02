-- dead: Core.dead_keys, read only: the first keys given up, newest first
-- (none older than DEAD_MAX_AGE: lib/dead.lua).
-- KEYS: dirty processing delayed stats dead dead_info groups
-- ARGV: [1] clock, [2] limit (0: none).
-- Returns {keys, when each was given up, each one's entry (JSON)}.
--- @include "dead"
local limit = tonumber(ARGV[2])
if limit <= 0 then
  return { {}, {}, {} }
end
local keys, times = {}, {}
local rows = newest_dead(limit)
for i = 1, #rows, 2 do
  keys[#keys + 1] = rows[i]
  times[#times + 1] = rows[i + 1]
end
return { keys, times, each_of('HMGET', DEAD_INFO, keys) }
