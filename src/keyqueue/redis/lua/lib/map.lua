-- map: a sharded queue's map, as a shard's scripts check it (redis/_resharding.py).
-- Each shard's STATS holds the map's epoch (map_epoch, raised by every
-- reshard; absent, 0, on a queue never sharded) and count (map_shards). A
-- client that routes by an older map than the shard's is refused before
-- anything changes (MAPCHANGED): it reloads the map and asks again, perhaps
-- another shard. A client of an unsharded queue sends no map: epoch 0.
--
-- While a reshard moves keys, a call whose key moves (KEY_MOVES: the client
-- routes it to the key's old shard first) is served here only if the key
-- is held here: a held key stays until its holder is done. Else nothing
-- changes and the answer is KEYMOVED: the client has the key exported from
-- here and imported into its new shard (export.lua, import.lua), and asks
-- there. A key that moves thus never gains state in its old shard once
-- not held, which is what lets the move end.
--- @include "base"

-- The MAPCHANGED error if the client's map is older than the shard's
-- (epoch, shards, moving from), else nil. A client that sends no map (an
-- unsharded one) is served by a queue of one shard that no reshard moves:
-- every key is in shard 0, its slot.
local function map_changed(epoch, shards, from)
  if CLIENT_EPOCH == nil and shards == '1' and not from then
    return nil
  end
  if tonumber(epoch or 0) > (CLIENT_EPOCH or 0) then
    return redis.error_reply('MAPCHANGED the queue is resharded (map epoch ' .. tostring(epoch)
      .. ', ' .. tostring(shards) .. ' shards) and this client routes by epoch '
      .. tostring(CLIENT_EPOCH or 0) .. ': nothing changed; a client made with shards=1 '
      .. 'cannot follow it, make it with shards=' .. tostring(shards))
  end
  return nil
end

-- The KEYMOVED error if the call's key moves and is not held here (held: the
-- key's hold here), else nil.
local function moved_away(held)
  if KEY_MOVES and not held then
    return redis.error_reply('KEYMOVED the key moves to another shard and is not held here: nothing changed')
  end
  return nil
end
