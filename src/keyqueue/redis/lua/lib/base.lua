-- base: what every script starts with. The clock: ARGV[1] is always it, ''
-- reads the server's TIME (the only clock in production), anything else is
-- the reading of a virtual clock (tests). The counters Stats reports.
--
-- Times are float seconds. Numbers go to Redis and back to the client as
-- strings made by num() (17 significant digits), never as Lua numbers (which
-- Redis would truncate to integers).

local function num(x)
  return string.format('%.17g', x)
end

local function read_clock()
  if ARGV[1] ~= '' then
    return tonumber(ARGV[1])
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local now = read_clock()

local function count(field)
  redis.call('HINCRBY', STATS, field, 1)
end
