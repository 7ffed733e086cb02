-- retry: Front.retry. Core.record_failure; unless that gives up, the re-add
-- after the backoff: the server limiter's add_rate_limited, or add_after by
-- the delay a client's local limiter computed.
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2] token of the caller's
-- hold ('' for none: unfenced), [3] request seq, [4] key, [5] max_retries
-- ('' for none), [6] the local limiter's delay ('' for the server limiter),
-- [7..10] base, cap, qps, burst, [11..14] endpoint, endpoint qps, endpoint
-- burst, max endpoints (or nothing).
-- Returns {now, 1 to retry or 0 to give up, events, status} (status: common.lua
-- fence; on 'lost' nothing changed).
promote()
local key, token, seq = ARGV[4], ARGV[2], ARGV[3]
local status, result = fence(key, token, seq)
if status ~= 'ok' then
  return fenced_reply(status, result)
end
local again = 0
if record_failure(key, ARGV[5]) then
  again = 1
  if ARGV[6] ~= '' then
    add_after(key, tonumber(ARGV[6]), 'rate_limit')
  else
    local limiter = { ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13], ARGV[14] }
    add_after(key, when(key, limiter), 'rate_limit')
  end
end
settled(key, token, seq, again)
return fenced_reply('ok', again)
