-- get: Core.get (the FIFO's oldest, or once ranked the first ranked), with a
-- lease and a fencing token. Runs promote and reap first, so any client's get
-- releases due keys and expired leases.
-- KEYS: dirty fifo processing lease delayed delay_seq failures requeues bucket
--   stats bell taken_back repushed ranked rank arrivals by_priority
--   pending_priority delayed_priority failing
-- ARGV: [1] clock, [2] lease seconds, [3..7] reap config (lib/reap.lua
-- reap_config), [8] the caller's holder identity (recorded with the lease).
-- Returns {now, 1, key, token, events} or, when nothing waits,
-- {now, 0, seconds until something comes due ('' if nothing will), events}
-- (a flag, not an empty key, says which: '' is a key like any other).
--- @include "promote"
--- @include "reap"
--- @include "handout"
promote()
reap(reap_config(3))
local handed = hand_out(1, tonumber(ARGV[2]), ARGV[8])
if #handed == 0 then
  redis.call('DEL', BELL) -- every element left rang for a key already taken
  redis.call('HSETNX', STATS, 'seq', 0) -- a getter used the queue: it exists (STATS)
  return { num(now), 0, next_due(), events }
end
return { num(now), 1, handed[1], handed[2], events }
