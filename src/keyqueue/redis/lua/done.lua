-- done: Core.done, fenced by the lease token. A done clears the key's stall
-- record (its stalls in a row), if it had one when handed out.
-- KEYS: dirty fifo processing lease delayed delay_seq stats bell taken_back
--   repushed ranked rank arrivals by_priority pending_priority delayed_priority
--   stalls dead groups fair_keys fair_turns fair_turn_of
-- ARGV: [1] clock, [2] key, [3] token, [4] '1' when asked again after a call
-- whose outcome is unknown, else ''.
-- Returns {now, status, events}, status one of
--   'ok'     released (pushed again if it was added meanwhile);
--   'repeat' this token's done already ran (asked again after a lost reply):
--            nothing;
--   'lost'   the lease was taken back; someone else may hold the key: nothing
--            changed but the leases_lost counter.
-- A first done whose token is not the key's lease is always 'lost' (only reap
-- ends a hold but its done); one asked again is 'lost' only if taken_back
-- says so (its first may have run, and the key been handed out again since).
--- @include "events"
--- @include "promote"
--- @include "lease"
--- @include "release"
--- @include "stalls"
promote()
local key, token = ARGV[2], ARGV[3]
local held, started, _, _, _, _, run = lease_of(key)
if held == token then
  local worked = now - tonumber(started)
  count('dones')
  redis.call('HINCRBYFLOAT', STATS, 'work_seconds', num(worked))
  emit('done', key, worked)
  if had_stalled(run) then
    drop_records({ key })
  end
  if release(key) then
    emit('redeliver', key)
  end
  return { num(now), 'ok', events }
end
if ARGV[4] ~= '1' or taken_back(key, token) then
  lease_lost(key, token)
  return { num(now), 'lost', events }
end
repeated()
return { num(now), 'repeat', events }
