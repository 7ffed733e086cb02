-- lease: a hold's lease, and how a holder learns it was taken back.
--- @include "base"

-- A lease's fields (parse_lease: of its value, HGET's false for none; lease_of:
-- of the key's), as strings, nil if the key is not held: token, the time of its
-- get, the priority it was handed out with, the seq and result of the last
-- fenced outcome its holder applied, its holder's identity ('' for a hold
-- taken before holders were recorded), and run: whether the holder's handler
-- started, 'u' not yet (a claimed key, until the client reports its start),
-- 's' started (a get's key from the start: its caller has it when get
-- returns; a hold taken before runs were recorded); upper case ('U', 'S')
-- when the key had a stall record (STALLS) as it was handed out: its done
-- clears the record.
local function parse_lease(held)
  if not held then
    return nil
  end
  local token, started, priority, seq, result, holder, run =
    string.match(held, '^(%d+) (%S+) ?(%S*) ?(%S*) ?(%S*) ?(%S*) ?(%S*)$')
  if priority == '' then -- a hold taken before the outcome fields existed
    priority, seq, result = '0', '0', '-'
  end
  if run == '' then -- a hold taken before runs were recorded: its handler may run
    run = 's'
  end
  return token, started, priority, seq, result, holder, run
end

local function lease_of(key)
  return parse_lease(redis.call('HGET', LEASE, key))
end

-- A lease's value: the fields lease_of reads, in order.
local function lease_value(token, started, priority, seq, result, holder, run)
  return token .. ' ' .. started .. ' ' .. priority .. ' ' .. seq .. ' ' .. result .. ' ' .. holder .. ' ' .. run
end

-- Whether a hold's handler started (run 's' or 'S').
local function has_started(run)
  return run == 's' or run == 'S'
end

-- Whether the key had a stall record when the hold was handed out (run upper case).
local function had_stalled(run)
  return run == 'S' or run == 'U'
end

-- The lease value of a hold whose handler started, from its value held (nil
-- if it had started already).
local function started_value(held)
  local token, started, priority, seq, result, holder, run = parse_lease(held)
  if has_started(run) then
    return nil
  end
  return lease_value(token, started, priority, seq, result, holder, had_stalled(run) and 'S' or 's')
end

-- Record the starts a client reports: keys and tokens of holds whose handler
-- started, their lease values read by the caller (leases[offset + n] is the
-- n-th key's). A key whose token is not its lease's any more (taken back, or
-- done) changes nothing. One command for all of them.
local function record_starts(keys, tokens, leases, offset)
  local values = {}
  for n, key in ipairs(keys) do
    local held = leases[offset + n]
    if parse_lease(held) == tokens[n] then
      local value = started_value(held)
      if value then
        values[#values + 1] = key
        values[#values + 1] = value
      end
    end
  end
  if #values > 0 then
    each_of('HSET', LEASE, values) -- CHUNK is even: each part has whole pairs
  end
end

-- Whether the hold with this token is over because reap took its lease back
-- (not because its done ran): the key's highest taken-back token says. (Another
-- token on the key's lease proves nothing: a done of this token may have run,
-- and the key been handed out again since.)
local function taken_back(key, token)
  local last = redis.call('HGET', TAKEN_BACK, key)
  return last ~= false and tonumber(string.match(last, '^(%d+)')) >= tonumber(token)
end

-- A call asked again whose first run was applied answers 'repeat' and changes
-- nothing, yet its answer stands on that first run's writes. One write that
-- changes no value (HINCRBY by 0), so that a WAIT behind the script (the
-- replicated mode's) counts from this point of the replication stream, which
-- covers them: WAIT waits for its own connection's last write, and a script
-- that wrote nothing would be confirmed by an older one (by none at all on a
-- new connection).
local function repeated()
  redis.call('HINCRBY', STATS, 'dones', 0)
end

-- A holder learns that its lease was taken back: counted in leases_lost once
-- per taken-back token (its renewal and its outcome may both learn it; the
-- key's record is marked with a '!' once learned).
local function lease_lost(key, token)
  local last = redis.call('HGET', TAKEN_BACK, key)
  if last == token .. '!' then
    return
  end
  if last == token then
    redis.call('HSET', TAKEN_BACK, key, token .. '!')
  end
  count('leases_lost')
end
