-- events: what happened, for the calling client's subscribers and metrics: a
-- flat list of kind, key, duration ('' when none). Counters live in STATS.
--- @include "base"

local events = {}

local function emit(kind, key, duration)
  events[#events + 1] = kind
  events[#events + 1] = key
  events[#events + 1] = duration and num(duration) or ''
end
