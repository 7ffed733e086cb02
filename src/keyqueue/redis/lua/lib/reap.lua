-- reap: expired leases taken back, each as its holder's done, then by whether
-- its handler had started (the lease's run, lib/lease.lua):
--   not started (a claimed key no worker took): it waits again at once, no
--     failure, no stall; its stall record (STALLS, 0 if it had none) makes its
--     next claimant report its start before the handler runs, so a key that
--     kills its process before the start is reported is counted next time;
--   started: a stall (the holder died, or stopped renewing, with the handler
--     running), not a failure: it waits again at once, and its stall record
--     counts the stalls in a row (a done or forget clears it); past max_stalls
--     it is given up as a poison key (forgotten, with its failures, and kept
--     as dead: lib/dead.lua, its stalls as its failures).
--- @include "promote"
--- @include "add"
--- @include "failures"
--- @include "lease"
--- @include "release"
--- @include "stalls"
--- @include "dead"

-- reap: every lease expired by now ends as its holder's done would, then as
-- above. The token is remembered in TAKEN_BACK so the late holder's done
-- raises LeaseLost. The key waits again with the priority it was handed out
-- with (a pending add's, if higher).
local function reap(max_stalls)
  local expired = redis.call('ZRANGEBYSCORE', PROCESSING, '-inf', num(now), 'LIMIT', 0, BATCH)
  for _, key in ipairs(expired) do
    local token, started, priority, _, _, _, run = lease_of(key)
    redis.call('HSET', TAKEN_BACK, key, token)
    count('leases_expired')
    emit('lease_expired', key, now - tonumber(started))
    if release(key, true) then
      emit('redeliver', key)
    end
    local stalls = 0
    if has_started(run) then
      count('stalls')
      emit('stall', key, now - tonumber(started))
      stalls = record_stall(key)
    else
      keep_record(key)
    end
    if stalls > max_stalls then
      forget({ key })
      drop_records({ key })
      bury(key, stalls, 'stalls', '', '')
      count('given_up_stalls')
      emit('poison', key)
    else
      add(key, tonumber(priority))
    end
  end
end

-- The reap configuration every reaping script takes after its own ARGV:
-- max_stalls.
local function reap_config(first)
  return tonumber(ARGV[first])
end
