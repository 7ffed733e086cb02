-- reap: promote due delayed keys and reap expired leases (common.lua), nothing
-- else. Any client may run it at any time; running it twice changes nothing
-- more. Clients on a virtual clock run it when the clock steps.
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2..6] reap config.
-- Returns {now, events}.
promote()
reap(reap_config(2))
return { num(now), events }
