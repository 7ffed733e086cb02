-- renew: extend this client's leases to now + lease, fenced by their tokens,
-- and record the starts of those whose handler started since it last said.
-- An expired lease not yet reaped is renewed too: nobody else can hold it.
-- Also the synchronous start of a claimed key whose last holder died holding
-- it (claim.lua's suspects): a renewal of that hold alone.
-- KEYS: processing lease stats taken_back
-- ARGV: [1] clock, [2] lease seconds, [3..] key, token, start triples (start
-- 's': the hold's handler started, lib/lease.lua; 'S': the same, reported
-- synchronously before the handler runs, by a holder that has not called
-- done: any other token on the key means the lease was lost; '-' nothing to
-- record).
-- Returns {now, key, token pairs whose lease was taken back}: each counted
-- once in leases_lost. A hold whose done already ran (a renewal that crossed
-- it) is skipped, even if the key has a new hold.
--- @include "lease"
local lease = tonumber(ARGV[2])
local lost = {}
for i = 3, #ARGV, 3 do
  local key, token = ARGV[i], ARGV[i + 1]
  local held = redis.call('HGET', LEASE, key)
  if parse_lease(held) == token then
    redis.call('ZADD', PROCESSING, 'XX', num(now + lease), key)
    if ARGV[i + 2] ~= '-' then
      local value = started_value(held)
      if value then
        redis.call('HSET', LEASE, key, value)
      end
    end
  elseif ARGV[i + 2] == 'S' or taken_back(key, token) then
    lease_lost(key, token)
    lost[#lost + 1] = key
    lost[#lost + 1] = token
  end
end
return { num(now), lost }
