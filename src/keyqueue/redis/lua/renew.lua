-- renew: extend this client's leases to now + lease, fenced by their tokens.
-- An expired lease not yet reaped is renewed too: nobody else can hold it.
-- KEYS: processing lease stats taken_back
-- ARGV: [1] clock, [2] lease seconds, [3..] key, token pairs.
-- Returns {now, key, token pairs whose lease was taken back}: each counted
-- once in leases_lost. A hold whose done already ran (a renewal that crossed
-- it) is skipped, even if the key has a new hold.
--- @include "lease"
local lease = tonumber(ARGV[2])
local lost = {}
for i = 3, #ARGV, 2 do
  local key, token = ARGV[i], ARGV[i + 1]
  if lease_of(key) == token then
    redis.call('ZADD', PROCESSING, 'XX', num(now + lease), key)
  elseif taken_back(key, token) then
    lease_lost(key, token)
    lost[#lost + 1] = key
    lost[#lost + 1] = token
  end
end
return { num(now), lost }
