-- add_rate_limited: record a failure with the server rate limiter and
-- add_after the key by its when() (Front.add_rate_limited with the limiter
-- transcribed: its state is in KEYS requeues, bucket and endpoints, shared
-- by all).
-- KEYS: dirty fifo processing lease delayed delay_seq requeues stats bell
--   taken_back repushed ranked rank arrivals by_priority pending_priority
--   delayed_priority groups fair_keys fair_turns fair_turn_of bucket endpoints
--   endpoint_lru
-- ARGV: [1] clock, [2] token of the caller's hold of the key ('' for none:
-- unfenced), [3] request seq, [4] key, [5] base, [6] cap, [7] qps, [8] burst,
-- [9] priority, [10] aging (as add.lua), [11] endpoint, [12] endpoint qps
-- ('' for no endpoint), [13] endpoint burst, [14] max endpoints, and from a
-- client with fair_by [15] the key's group (lib/fair.lua).
-- Returns {now, 1 if pushed now, events, status} (status: lib/fence.lua; on
-- 'lost' nothing changed).
-- Unfenced, the error MAPCHANGED, or KEYMOVED (its key moves and is not held
-- here), nothing changed (lib/map.lua).
--- @include "fence"
--- @include "rank"
--- @include "promote"
--- @include "add_after"
--- @include "endpoint"
--- @include "map"
if ARGV[2] == '' then -- unfenced (a fenced call's key is held here, its holder's)
  local refused = map_changed(FLAGS[4], FLAGS[5], FLAGS[6])
    or (KEY_MOVES and moved_away(redis.call('ZSCORE', PROCESSING, ARGV[4])))
  if refused then
    return refused
  end
end
return fenced(function(key)
  local priority = ranking(ARGV[9], ARGV[10])
  keep_groups(ARGV[15] and cjson.encode({ ARGV[15] }), { key }, ARGV[10])
  promote()
  local limiter = { ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[11], ARGV[12], ARGV[13], ARGV[14] }
  return add_after(key, limited_when(key, limiter), 'rate_limit', priority)
end)
