-- claim: a worker process's round trip: settle the holds it finished (done,
-- or forget and done), then Core.get up to n times, each key with its own
-- lease and fencing token. Runs promote and reap as get does.
-- KEYS: dirty fifo processing lease delayed delay_seq failures requeues bucket
--   stats bell taken_back repushed ranked rank arrivals by_priority
--   pending_priority delayed_priority failing
-- ARGV: [1] clock, [2] lease seconds, [3..7] reap config (lib/reap.lua
-- reap_config), [8] the caller's holder identity, [9] n: how many keys to
-- take at most (0: only settle), [10..] the holds to settle, as triples key,
-- token, mode (lib/settle.lua).
-- Returns {now, statuses of the settled holds (in order), the keys taken as
-- key, token pairs, seconds until something comes due ('' if nothing will;
-- only when none was taken), events}.
--- @include "promote"
--- @include "reap"
--- @include "handout"
--- @include "settle"
promote()
local statuses = settle(10)
reap(reap_config(3))
local want = tonumber(ARGV[9])
local handed = {}
if want > 0 then
  handed = hand_out(want, tonumber(ARGV[2]), ARGV[8])
end
local due = ''
if #handed < want then
  redis.call('DEL', BELL) -- every element left rang for a key already taken
  if #handed == 0 then
    redis.call('HSETNX', STATS, 'seq', 0) -- a getter used the queue: it exists (STATS)
    due = next_due()
  end
end
return { num(now), statuses, handed, due, events }
