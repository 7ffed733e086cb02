-- retry: Front.retry. Core.record_failure; unless that gives up, the re-add
-- after the backoff: the server limiter's add_rate_limited, or add_after by
-- the delay a client's local limiter computed.
-- KEYS: dirty fifo processing lease delayed delay_seq failures requeues stats
--   bell taken_back ranked rank arrivals by_priority pending_priority
--   delayed_priority failing groups fair_keys fair_turns fair_turn_of bucket
--   endpoints endpoint_lru
-- ARGV: [1] clock, [2] token of the caller's hold ('' for none: unfenced),
-- [3] request seq, [4] key, [5] max_retries ('' for none), [6] the local
-- limiter's delay ('' for the server limiter), [7..10] base, cap, qps, burst,
-- [11..14] endpoint, endpoint qps, endpoint burst, max endpoints (or nothing).
-- Returns {now, 1 to retry or 0 to give up, events, status} (status:
-- lib/fence.lua; on 'lost' nothing changed).
-- Unfenced, the error MAPCHANGED, or KEYMOVED (its key moves and is not held
-- here), nothing changed (lib/map.lua).
--- @include "promote"
--- @include "fence"
--- @include "failures"
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
promote()
return fenced(function(key)
  if not record_failure(key, ARGV[5]) then
    count('given_up_retries')
    return 0
  end
  if ARGV[6] ~= '' then
    add_after(key, tonumber(ARGV[6]), 'rate_limit')
  else
    local limiter = { ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13], ARGV[14] }
    add_after(key, limited_when(key, limiter), 'rate_limit')
  end
  return 1
end)
