-- promote: Core.promote, delayed keys that came due.
--- @include "add"

local BATCH = 100 -- due delayed keys and expired leases handled per script

-- Core.promote: apply the add rule to every delayed key ready now, in
-- ready-time order, ties in the order their delays were asked for. Every
-- script but renew and forget runs it first, so a due key is waiting before
-- anything else happens, as with the in-memory fronts' timers.
local function promote()
  local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', num(now), 'WITHSCORES', 'LIMIT', 0, BATCH)
  if #due == 0 then
    return
  end
  local entries = {}
  for i = 1, #due, 2 do
    local key = due[i]
    entries[#entries + 1] = { key, tonumber(due[i + 1]), tonumber(redis.call('HGET', DELAY_SEQ, key) or 0) }
  end
  table.sort(entries, function(a, b)
    if a[2] ~= b[2] then
      return a[2] < b[2]
    end
    return a[3] < b[3]
  end)
  for _, entry in ipairs(entries) do
    local priority = 0
    if ranked then
      priority = tonumber(redis.call('HGET', DELAYED_PRIORITY, entry[1]) or 0)
      redis.call('HDEL', DELAYED_PRIORITY, entry[1])
    end
    redis.call('ZREM', DELAYED, entry[1])
    redis.call('HDEL', DELAY_SEQ, entry[1])
    add(entry[1], priority)
  end
end
