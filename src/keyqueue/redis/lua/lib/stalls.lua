-- stalls: the stall records (STALLS: key -> its stalls in a row, 0 for a key
-- taken back before its handler started; lib/reap.lua) and their count,
-- kept in STATS stalled_keys so that a hand-out reads STALLS only when some
-- key has a record (the count is read with the flags: no command of its
-- own). Every script that adds or drops a record goes through these.
--- @include "flags"

local stalled_keys = tonumber(FLAGS[3] or 0)

local function count_records(n)
  stalled_keys = stalled_keys + n
  redis.call('HINCRBY', STATS, 'stalled_keys', n)
end

-- The key has a record from now on (0 if it had none). Returns its stalls.
local function keep_record(key)
  if redis.call('HSETNX', STALLS, key, 0) == 1 then
    count_records(1)
    return 0
  end
  return tonumber(redis.call('HGET', STALLS, key))
end

-- One more stall of the key in a row: how many now.
local function record_stall(key)
  keep_record(key)
  return redis.call('HINCRBY', STALLS, key, 1)
end

-- Drop the records of keys (those that have none are skipped).
local function drop_records(keys)
  local dropped = 0
  for first = 1, #keys, CHUNK do
    dropped = dropped + redis.call('HDEL', STALLS, unpack(keys, first, math.min(#keys, first + CHUNK - 1)))
  end
  if dropped > 0 then
    count_records(-dropped)
  end
end

-- Which of keys have a record (a list of true/false, in order): one HMGET,
-- none when no key has a record.
local function have_records(keys)
  local has = {}
  if stalled_keys > 0 then
    local records = redis.call('HMGET', STALLS, unpack(keys))
    for i = 1, #keys do
      has[i] = records[i] ~= false
    end
  else
    for i = 1, #keys do
      has[i] = false
    end
  end
  return has
end
