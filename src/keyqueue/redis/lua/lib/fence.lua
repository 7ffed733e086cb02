-- fence: the fence of a holder's outcome (retry, add_after, add_rate_limited,
-- forget): its token and request seq.
--- @include "events"
--- @include "lease"

-- The fence of an outcome (retry, add_after, add_rate_limited, forget) asked
-- by a holder: token '' for a caller that holds nothing (unfenced: 'ok').
-- 'lost' if the hold's lease is not its own any more (counted once: the
-- holder learns it here), 'repeat' and the result it gave if this request
-- (seq, per hold) was applied already (asked again after a lost reply), or
-- 'ok': apply it, then settled(). Keeps the hold's run in fenced_run (nil
-- for an unfenced caller) for apply.
local fenced_run = nil
local function fence(key, token, seq)
  if token == '' then
    return 'ok'
  end
  local held, _, _, applied, result, _, run = lease_of(key)
  fenced_run = run
  if held ~= token then
    lease_lost(key, token)
    return 'lost'
  end
  if tonumber(seq) <= tonumber(applied) then
    repeated()
    return 'repeat', tonumber(result)
  end
  return 'ok'
end

-- Record that the holder's request seq was applied, with its result.
local function settled(key, token, seq, result)
  if token == '' then
    return
  end
  local held, started, priority, _, _, holder, run = lease_of(key)
  redis.call('HSET', LEASE, key, lease_value(held, started, priority, seq, result, holder, run))
end

-- A fenced script's reply: {now, result, events, status}.
local function fenced_reply(status, result)
  return { num(now), result or 0, events, status }
end

-- A fenced outcome: ARGV [2] token ('' for none: unfenced), [3] request seq,
-- [4] key. Unless fence() says otherwise, apply(key) and record its result
-- (settled()); the script's reply either way.
local function fenced(apply)
  local key, token, seq = ARGV[4], ARGV[2], ARGV[3]
  local status, result = fence(key, token, seq)
  if status ~= 'ok' then
    return fenced_reply(status, result)
  end
  result = apply(key)
  settled(key, token, seq, result)
  return fenced_reply('ok', result)
end
