-- events: what happened, for the calling client's subscribers and metrics: a
-- flat list of kind, key, duration ('' when none). Counters live in STATS.
--- @include "base"

local events = {}
-- Set by a script whose caller has nobody listening (claim.lua's ARGV[9]):
-- only the poison events, which the client acts on itself, are kept.
local events_quiet = false

local function emit(kind, key, duration)
  if events_quiet and kind ~= 'poison' then
    return
  end
  events[#events + 1] = kind
  events[#events + 1] = key
  events[#events + 1] = duration and num(duration) or ''
end
