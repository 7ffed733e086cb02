-- retry: Front.retry. Core.record_failure; unless that gives up, the server
-- limiter's add_rate_limited (a client with a local limiter passes no limiter
-- and calls add_after itself with its own delay).
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2] key, [3] max_retries
-- ('' for none), [4..7] base, cap, qps, burst, [8..11] endpoint, endpoint
-- qps, endpoint burst, max endpoints (or nothing).
-- Returns {now, 1 to retry or 0 to give up, events}.
promote()
local key = ARGV[2]
if not record_failure(key, ARGV[3]) then
  return { num(now), 0, events }
end
if #ARGV >= 7 then
  local limiter = { ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11] }
  add_after(key, when(key, limiter), 'rate_limit')
end
return { num(now), 1, events }
