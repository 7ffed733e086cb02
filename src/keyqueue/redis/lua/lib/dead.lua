-- dead: Core.give_up's keeping half: the keys given up, oldest first in DEAD
-- (scored by when), each one's entry in DEAD_INFO (JSON: reason, error type,
-- error message, failures; false for no error). Bounded by DEAD_LIMIT keys
-- and DEAD_MAX_AGE seconds (keyqueue._dead's, the same numbers): every bury
-- trims, so the set costs O(log n) per give-up and nothing on any other path;
-- replay and forget_dead trim too, and the readers (dead.lua, snapshot.lua)
-- skip an entry past the age, so none older is ever listed or replayed.
-- A fair queue's dead key keeps its group (GROUPS, lib/fair.lua) for a replay;
-- it goes when the entry does.
--- @include "base"

local DEAD_LIMIT = 1000
local DEAD_MAX_AGE = 604800

-- Dead keys dropped from the set lose their group, unless they are back
-- (waiting, held or delayed).
local function drop_dead_groups(keys)
  if redis.call('EXISTS', GROUPS) == 0 then
    return
  end
  for _, key in ipairs(keys) do
    if redis.call('HEXISTS', DIRTY, key) == 0 and not redis.call('ZSCORE', PROCESSING, key)
      and not redis.call('ZSCORE', DELAYED, key) then
      redis.call('HDEL', GROUPS, key)
    end
  end
end

-- Drop the oldest entries: those older than DEAD_MAX_AGE (100 at a time),
-- then those beyond DEAD_LIMIT.
local function trim_dead()
  local old = redis.call('ZRANGEBYSCORE', DEAD, '-inf', num(now - DEAD_MAX_AGE), 'LIMIT', 0, 100)
  local excess = redis.call('ZCARD', DEAD) - #old - DEAD_LIMIT
  if excess > 0 then
    old = redis.call('ZRANGE', DEAD, 0, #old + excess - 1)
  end
  if #old > 0 then
    redis.call('ZREM', DEAD, unpack(old))
    redis.call('HDEL', DEAD_INFO, unpack(old))
    drop_dead_groups(old)
  end
end

-- The first `limit` live dead keys, newest first, with their scores: those
-- given up less than DEAD_MAX_AGE ago (an older one is dropped by the next
-- writing script that trims, but never shown meanwhile).
local function newest_dead(limit)
  return redis.call('ZRANGE', DEAD, '+inf', '(' .. num(now - DEAD_MAX_AGE), 'BYSCORE', 'REV',
    'LIMIT', 0, limit, 'WITHSCORES')
end

-- Keep the key as dead (replacing an earlier entry of it: the newest now).
-- error_type '' for no error (then message is not kept).
local function bury(key, failures, reason, error_type, message)
  local kept_type, kept_message = false, false
  if error_type ~= '' then
    kept_type, kept_message = error_type, message
  end
  redis.call('ZADD', DEAD, num(now), key)
  redis.call('HSET', DEAD_INFO, key,
    cjson.encode({ reason, kept_type, kept_message, tonumber(failures) or 0 }))
  trim_dead()
end
