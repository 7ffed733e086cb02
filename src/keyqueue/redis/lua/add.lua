-- add: Core.add, for one key or many, all with one priority.
-- KEYS: dirty fifo processing delayed delay_seq stats bell repushed ranked rank
--   arrivals by_priority pending_priority delayed_priority groups fair_keys
--   fair_turns fair_turn_of
-- ARGV: [1] clock, [2] priority, [3] aging ('' for strict: the client's,
-- stored when the queue becomes ranked), [4] the keys' groups from a client
-- with fair_by (a JSON list; '' without: lib/fair.lua), [5..] keys.
-- Returns {now, how many keys were pushed, events}.
-- Or the error MAPCHANGED, or KEYMOVED (its key moves and is not held here),
-- nothing changed (lib/map.lua).
--- @include "rank"
--- @include "promote"
--- @include "map"
local refused = map_changed(FLAGS[4], FLAGS[5], FLAGS[6])
  or (KEY_MOVES and moved_away(redis.call('ZSCORE', PROCESSING, ARGV[5])))
if refused then
  return refused
end
local priority = ranking(ARGV[2], ARGV[3])
promote()
if ARGV[4] ~= '' then
  keep_groups(ARGV[4], { unpack(ARGV, 5) }, ARGV[3])
end
local pushed = 0
for i = 5, #ARGV do
  pushed = pushed + add(ARGV[i], priority)
end
return { num(now), pushed, events }
