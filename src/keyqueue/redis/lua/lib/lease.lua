-- lease: a hold's lease, and how a holder learns it was taken back.
--- @include "base"

-- A lease's fields (parse_lease: of its value, HGET's false for none; lease_of:
-- of the key's), as strings, nil if the key is not held: token, the time of its
-- get, the priority it was handed out with, the seq and result of the last
-- fenced outcome its holder applied, and its holder's identity ('' for a hold
-- taken before holders were recorded).
local function parse_lease(held)
  if not held then
    return nil
  end
  local token, started, priority, seq, result, holder =
    string.match(held, '^(%d+) (%S+) ?(%S*) ?(%S*) ?(%S*) ?(%S*)$')
  if priority == '' then -- a hold taken before the outcome fields existed
    priority, seq, result = '0', '0', '-'
  end
  return token, started, priority, seq, result, holder
end

local function lease_of(key)
  return parse_lease(redis.call('HGET', LEASE, key))
end

-- A lease's value: the fields lease_of reads, in order.
local function lease_value(token, started, priority, seq, result, holder)
  return table.concat({ token, started, priority, seq, result, holder }, ' ')
end

-- Whether the hold with this token is over because reap took its lease back
-- (not because its done ran): the key's highest taken-back token says. (Another
-- token on the key's lease proves nothing: a done of this token may have run,
-- and the key been handed out again since.)
local function taken_back(key, token)
  local last = redis.call('HGET', TAKEN_BACK, key)
  return last ~= false and tonumber(string.match(last, '^(%d+)')) >= tonumber(token)
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
