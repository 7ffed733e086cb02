-- add_after: Core.add_after (kind 'delay'), and add_rate_limited for a client
-- whose rate limiter is local (kind 'rate_limit', the delay computed there).
-- KEYS: dirty fifo processing lease delayed delay_seq stats bell taken_back
--   repushed ranked rank arrivals by_priority pending_priority delayed_priority
--   groups fair_keys fair_turns fair_turn_of
-- ARGV: [1] clock, [2] token of the caller's hold of the key ('' for none:
-- unfenced), [3] request seq, [4] key, [5] delay seconds, [6] kind,
-- [7] priority, [8] aging (as add.lua), and from a client with fair_by
-- [9] the key's group (lib/fair.lua).
-- Returns {now, 1 if pushed now, events, status} (status: lib/fence.lua; on
-- 'lost' nothing changed).
-- Unfenced, the error MAPCHANGED, or KEYMOVED (its key moves and is not held
-- here), nothing changed (lib/map.lua).
--- @include "fence"
--- @include "rank"
--- @include "promote"
--- @include "add_after"
--- @include "map"
if ARGV[2] == '' then -- unfenced (a fenced call's key is held here, its holder's)
  local refused = map_changed(FLAGS[4], FLAGS[5], FLAGS[6])
    or (KEY_MOVES and moved_away(redis.call('ZSCORE', PROCESSING, ARGV[4])))
  if refused then
    return refused
  end
end
return fenced(function(key)
  local priority = ranking(ARGV[7], ARGV[8])
  keep_groups(ARGV[9] and cjson.encode({ ARGV[9] }), { key }, ARGV[8])
  promote()
  return add_after(key, tonumber(ARGV[5]), ARGV[6], priority)
end)
