-- settle: many holds ended in one go, each fenced by its token: done, or
-- forget and done (a handler that succeeded); and the starts of others.
--- @include "lease"
--- @include "failures"
--- @include "release"
--- @include "stalls"

-- Settle the holds ARGV names from index first to last, as triples key, token,
-- mode: 'd' done, 'f' forget then done; upper case ('D', 'F') when asked
-- again after a call whose outcome is unknown; 's' for a hold that goes on,
-- whose handler started (record_starts). Each is checked against its token
-- as done.lua checks one. Returns the statuses of the ended holds, in order
-- (none for the starts): 'ok', 'repeat' or 'lost' (as done.lua's). A done
-- clears the key's stall record, if it had one when handed out.
local function settle(first, last)
  local statuses, keys, tokens, modes = {}, {}, {}, {}
  local starting, starting_tokens = {}, {}
  for i = first, last, 3 do
    if ARGV[i + 2] == 's' then
      starting[#starting + 1] = ARGV[i]
      starting_tokens[#starting] = ARGV[i + 1]
    else
      keys[#keys + 1] = ARGV[i]
      tokens[#keys], modes[#keys] = ARGV[i + 1], ARGV[i + 2]
    end
  end
  if #keys + #starting == 0 then
    return statuses
  end
  -- One read of the leases of both: the settled holds', then the started.
  local read = keys
  if #starting > 0 then
    read = {}
    for _, key in ipairs(keys) do
      read[#read + 1] = key
    end
    for _, key in ipairs(starting) do
      read[#read + 1] = key
    end
  end
  local leases = each_of('HMGET', LEASE, read)
  record_starts(starting, starting_tokens, leases, #keys)
  if #keys == 0 then
    return statuses
  end
  local released, forgotten, cleared = {}, {}, {}
  local worked, repeats = 0, false
  for n, key in ipairs(keys) do
    local token, mode = tokens[n], modes[n]
    local held, started, _, _, _, _, run = parse_lease(leases[n])
    if held == token then
      local took = now - tonumber(started)
      worked = worked + took
      released[#released + 1] = key
      if mode == 'f' or mode == 'F' then
        forgotten[#forgotten + 1] = key
      end
      if had_stalled(run) then
        cleared[#cleared + 1] = key
      end
      emit('done', key, took)
      statuses[n] = 'ok'
    elseif mode == 'd' or mode == 'f' or taken_back(key, token) then
      lease_lost(key, token)
      statuses[n] = 'lost'
    else
      statuses[n] = 'repeat'
      repeats = true
    end
  end
  -- Nothing to forget while no key has failures, requeues or a taken-back
  -- token (the common case): one EXISTS instead of four deletes.
  if #forgotten > 0 and redis.call('EXISTS', FAILURES, FAILING, REQUEUES, TAKEN_BACK) > 0 then
    forget(forgotten)
    each_of('HDEL', TAKEN_BACK, forgotten)
  end
  if #cleared > 0 then
    drop_records(cleared)
  end
  if #released > 0 then
    redis.call('HINCRBY', STATS, 'dones', #released)
    redis.call('HINCRBYFLOAT', STATS, 'work_seconds', num(worked))
    release_many(released)
  elseif repeats then
    repeated()
  end
  return statuses
end
