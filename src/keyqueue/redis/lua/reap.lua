-- reap: promote due delayed keys and reap expired leases (lib/reap.lua),
-- nothing else. Any client may run it at any time; running it twice changes
-- nothing more. Clients on a virtual clock run it when the clock steps.
-- KEYS: dirty fifo processing lease delayed delay_seq failures requeues stats
--   bell taken_back repushed ranked rank arrivals by_priority pending_priority
--   delayed_priority failing stalls dead dead_info groups fair_keys fair_turns
--   fair_turn_of
-- ARGV: [1] clock, [2] reap config (lib/reap.lua reap_config).
-- Returns {now, events}.
--- @include "promote"
--- @include "reap"
promote()
reap(reap_config(2))
return { num(now), events }
