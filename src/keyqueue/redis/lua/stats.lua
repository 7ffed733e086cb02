-- stats: the queue-wide counters and sizes, after promote and reap.
-- KEYS: dirty fifo processing lease delayed delay_seq failures requeues stats
--   bell taken_back repushed ranked rank arrivals by_priority pending_priority
--   delayed_priority failing stalls dead dead_info groups fair_keys fair_turns
--   fair_turn_of
-- ARGV: [1] clock, [2] reap config (lib/reap.lua reap_config).
-- Returns lib/summary.lua's summary().
--- @include "promote"
--- @include "reap"
--- @include "summary"
promote()
reap(reap_config(2))
return summary(events)
