-- base: what every script starts with. The clock: ARGV[1] is always it, ''
-- reads the server's TIME (the only clock in production), anything else is
-- the reading of a virtual clock (tests). The counters Stats reports.
--
-- A client of a sharded queue adds to ARGV[1] '@' and the epoch of the
-- shard map it routes by, and 'm' when the call's key moves in the reshard
-- under way (lib/map.lua): CLIENT_EPOCH (nil from a client that sends no
-- map: an unsharded one) and KEY_MOVES.
--
-- Times are float seconds. Numbers go to Redis and back to the client as
-- strings made by num() (17 significant digits), never as Lua numbers (which
-- Redis would truncate to integers).

local function num(x)
  return string.format('%.17g', x)
end

local CLOCK_ARG, CLIENT_EPOCH, KEY_MOVES = string.match(ARGV[1], '^([^@]*)(@?%d*)(m?)$')
CLIENT_EPOCH = tonumber(string.sub(CLIENT_EPOCH, 2))
KEY_MOVES = KEY_MOVES == 'm'

local function read_clock()
  if CLOCK_ARG ~= '' then
    return tonumber(CLOCK_ARG)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local now = read_clock()

-- command(key, names...) for names in chunks of CHUNK (few calls however many
-- names, and unpack's stack holds a chunk: it takes at most 8,000): the
-- replies in names' order (none for a command that answers a number). One
-- chunk's reply is returned as it came.
local CHUNK = 1000
local function each_of(command, key, names)
  if #names <= CHUNK then
    if #names == 0 then
      return {}
    end
    local part = redis.call(command, key, unpack(names))
    return type(part) == 'table' and part or {}
  end
  local replies = {}
  for first = 1, #names, CHUNK do
    local part = redis.call(command, key, unpack(names, first, math.min(#names, first + CHUNK - 1)))
    if type(part) == 'table' then
      for _, reply in ipairs(part) do
        replies[#replies + 1] = reply
      end
    end
  end
  return replies
end

local function count(field)
  redis.call('HINCRBY', STATS, field, 1)
end
