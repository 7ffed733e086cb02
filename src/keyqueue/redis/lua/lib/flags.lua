-- flags: what a script reads of the queue's STATS before anything else, in
-- one HMGET: ranked and aging (lib/ranked.lua), and how many keys have a
-- stall record (lib/stalls.lua).
--- @include "base"

local FLAGS = redis.call('HMGET', STATS, 'ranked', 'aging', 'stalled_keys')
