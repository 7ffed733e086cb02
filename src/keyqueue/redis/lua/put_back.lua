-- put_back: gets whose callers went away before they learned the key (a
-- cancelled get), or claimed keys no worker started: each key is added again
-- as if while held, then released as its done would, in one step: it waits
-- again at once, with the priority it was handed out with. No failure is
-- counted, no lease runs out. One run puts back every key it is given.
-- KEYS: dirty fifo processing lease delayed delay_seq stats bell taken_back
--   repushed ranked rank arrivals by_priority pending_priority delayed_priority
--   dead groups fair_keys fair_turns fair_turn_of
-- ARGV: [1] clock, [2] aging (as add.lua), [3..] key, token pairs.
-- Returns {now, per pair in order 1 if put back (0: the lease was not this
-- token's any more), events}.
--- @include "promote"
--- @include "back"
promote()
local put = {}
for i = 3, #ARGV, 2 do
  local key, token = ARGV[i], ARGV[i + 1]
  local held, started, priority = lease_of(key)
  if held == token then
    hand_back(key, started, priority, ARGV[2])
    put[#put + 1] = 1
  else
    put[#put + 1] = 0
  end
end
return { num(now), put, events }
