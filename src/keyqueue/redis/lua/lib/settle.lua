-- settle: many holds ended in one go, each fenced by its token: done, or
-- forget and done (a handler that succeeded).
--- @include "lease"
--- @include "failures"
--- @include "release"

-- Settle the holds ARGV names from index first on, as triples key, token,
-- mode: 'd' done, 'f' forget then done; upper case ('D', 'F') when asked
-- again after a call whose outcome is unknown. Each is checked against its
-- token as done.lua checks one. Returns their statuses, in order: 'ok',
-- 'repeat' or 'lost' (as done.lua's).
local function settle(first)
  local statuses, keys = {}, {}
  for i = first, #ARGV, 3 do
    keys[#keys + 1] = ARGV[i]
  end
  if #keys == 0 then
    return statuses
  end
  local leases = each_of('HMGET', LEASE, keys)
  local released, forgotten = {}, {}
  local worked = 0
  for n, key in ipairs(keys) do
    local token, mode = ARGV[first + 3 * n - 2], ARGV[first + 3 * n - 1]
    local held, started = parse_lease(leases[n])
    if held == token then
      local took = now - tonumber(started)
      worked = worked + took
      released[#released + 1] = key
      if mode == 'f' or mode == 'F' then
        forgotten[#forgotten + 1] = key
      end
      emit('done', key, took)
      statuses[n] = 'ok'
    elseif mode == 'd' or mode == 'f' or taken_back(key, token) then
      lease_lost(key, token)
      statuses[n] = 'lost'
    else
      statuses[n] = 'repeat'
    end
  end
  if #forgotten > 0 then
    forget(forgotten)
    each_of('HDEL', TAKEN_BACK, forgotten)
  end
  if #released > 0 then
    redis.call('HINCRBY', STATS, 'dones', #released)
    redis.call('HINCRBYFLOAT', STATS, 'work_seconds', num(worked))
    release_many(released)
  end
  return statuses
end
