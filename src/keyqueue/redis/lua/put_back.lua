-- put_back: a get whose caller went away before it learned the key (a
-- cancelled get), or a claimed key no worker started: the key is added again
-- as if while held, then released as its done would, in one step: it waits
-- again at once, with the priority it was handed out with. No failure is
-- counted, no lease runs out.
-- KEYS: dirty fifo processing lease delayed delay_seq stats bell taken_back
--   repushed ranked rank arrivals by_priority pending_priority
--   delayed_priority
-- ARGV: [1] clock, [2] key, [3] token, [4] aging (as add.lua).
-- Returns {now, 1 if put back (0: the lease was not this token's any more),
-- events}.
--- @include "promote"
--- @include "back"
promote()
local key, token = ARGV[2], ARGV[3]
local held, started, priority = lease_of(key)
if held ~= token then
  return { num(now), 0, events }
end
hand_back(key, started, priority, ARGV[4])
return { num(now), 1, events }
