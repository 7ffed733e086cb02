-- done: Core.done, fenced by the lease token.
-- KEYS: the queue's (common.lua). ARGV: [1] clock, [2] key, [3] token.
-- Returns {now, status, events}, status one of
--   'ok'     released (pushed again if it was added meanwhile);
--   'repeat' this token's done already ran (a retry after a lost reply): nothing;
--   'lost'   the lease was reaped; someone else may hold the key: nothing
--            changed but the leases_lost counter.
promote()
local key, token = ARGV[2], ARGV[3]
local held, started = lease_of(key)
if held == token then
  local worked = now - started
  count('dones')
  redis.call('HINCRBYFLOAT', STATS, 'work_seconds', num(worked))
  emit('done', key, worked)
  if release(key) then
    emit('redeliver', key)
  end
  return { num(now), 'ok', events }
end
if redis.call('ZSCORE', REAPED, token) then
  count('leases_lost')
  return { num(now), 'lost', events }
end
return { num(now), 'repeat', events }
