-- back: a hold handed back without a failure: the key waits again at once,
-- with the priority it was handed out with (put_back, and a claim whose
-- reply was lost).
--- @include "rank"
--- @include "lease"
--- @include "release"
--- @include "add"

-- The key held since started, with priority, is added again as if while
-- held, then released as its done would: no failure, no lease runs out.
local function hand_back(key, started, priority, aging)
  add(key, ranking(priority, aging))
  count('dones')
  redis.call('HINCRBYFLOAT', STATS, 'work_seconds', num(now - tonumber(started)))
  emit('done', key, now - tonumber(started))
  if release(key) then
    emit('redeliver', key)
  end
end
