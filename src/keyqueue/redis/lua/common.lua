-- common.lua: the rules of keyqueue/_core.py, transcribed for Redis/Valkey.
--
-- Every script is this file followed by one transition file (add.lua, get.lua,
-- ...); the client concatenates them. Each function below is named after the
-- Core method it transcribes. A script runs atomically, so no WATCH/MULTI.
--
-- KEYS (the same twenty-one, in this order, for every script; one hash tag {name}):
--   1 dirty       HASH  key -> time of the add that made it dirty (Core.dirty)
--   2 fifo        LIST  waiting keys, oldest first; each dirty and not processing
--   3 processing  ZSET  key -> lease expiry (Core.processing, plus leases)
--   4 lease       HASH  key -> "<token> <time of its get> <priority> <seq> <result>":
--                       the hold; seq and result are those of the last fenced
--                       outcome its holder applied (0 and - before any)
--   5 delayed     ZSET  key -> ready time; the earliest asked wins (ZADD LT)
--   6 delay_seq   HASH  key -> order of its delay request: ties come out in it
--   7 failures    HASH  key -> failures recorded for max_retries (Core.failures)
--   8 requeues    HASH  key -> failures the server rate limiter has seen
--   9 bucket      HASH  tokens, last: the server rate limiter's token bucket
--  10 stats       HASH  the counters Stats reports, and seq (fencing tokens)
--  11 bell        LIST  the doorbell: one element per push, BLPOPped by getters
--  12 taken_back  HASH  key -> the highest token of it that reap took back
--                       (one field per key, cleared by forget): tells a late
--                       done asked again from one that already ran
--  13 repushed    HASH  waiting key -> time done pushed it back (FIFO only):
--                       when it entered the waiting set (Core.repushed)
--  Priorities (docs/fairness.md). The queue starts as the FIFO list; the
--  first non-zero priority makes it ranked for good (STATS ranked = 1, and
--  aging, '' for strict), as Core.rank:
--  14 ranked      ZSET  waiting keys, "<seq, 16 hex digits><key>" scored by
--                       -priority (strict) or arrival - priority * aging:
--                       lowest first, equal scores in arrival order
--  15 rank        HASH  waiting key -> "<priority> <seq>"
--  16 arrivals    ZSET  waiting key -> when it entered the waiting set
--  17 by_priority HASH  priority -> waiting keys with it
--  18 pending_priority  HASH  key pending redelivery -> its priority (if not 0)
--  19 delayed_priority  HASH  delayed key -> the priority it is added with (if not 0)
--  20 endpoints   HASH  endpoint -> "<tokens> <last>": the server limiter's
--                       per-endpoint buckets, at most max_endpoints of them
--  21 endpoint_lru ZSET endpoint -> order of its last use (the least recent
--                       is dropped beyond max_endpoints)
--
-- ARGV[1] is always the clock: '' reads the server's TIME (the only clock in
-- production), anything else is the reading of a virtual clock (tests).
--
-- Times are float seconds. Numbers go to Redis and back to the client as
-- strings made by num() (17 significant digits), never as Lua numbers (which
-- Redis would truncate to integers).

local DIRTY, FIFO, PROCESSING, LEASE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local DELAYED, DELAY_SEQ, FAILURES, REQUEUES = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local BUCKET, STATS, BELL, TAKEN_BACK = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local REPUSHED, RANKED, RANK, ARRIVALS = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local BY_PRIORITY, PENDING_PRIORITY, DELAYED_PRIORITY = KEYS[17], KEYS[18], KEYS[19]
local ENDPOINTS, ENDPOINT_LRU = KEYS[20], KEYS[21]

local BELL_CAP = 1024 -- doorbell elements kept while nobody waits
local BATCH = 100 -- due delayed keys and expired leases handled per script

local function num(x)
  return string.format('%.17g', x)
end

local function read_clock()
  if ARGV[1] ~= '' then
    return tonumber(ARGV[1])
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local now = read_clock()

-- What happened, for the calling client's subscribers and metrics: a flat
-- list of kind, key, duration ('' when none). Counters live in STATS.
local events = {}

local function emit(kind, key, duration)
  events[#events + 1] = kind
  events[#events + 1] = key
  events[#events + 1] = duration and num(duration) or ''
end

local function count(field)
  redis.call('HINCRBY', STATS, field, 1)
end

-- Ranked (Core.rank): once true, the waiting keys are in RANKED, not FIFO.
-- aging: nil for strict priorities, else seconds per priority step.
local ranked = redis.call('HGET', STATS, 'ranked') == '1'
local aging = ranked and tonumber(redis.call('HGET', STATS, 'aging') or '') or nil

-- The rank of a key of this priority that arrived then: lowest first.
local function score(priority, arrival)
  if aging == nil then
    return -priority
  end
  return arrival - priority * aging
end

-- Core._push_ranked, without the bell: the key enters the waiting set.
local function rank_insert(key, priority, arrival)
  local seq = redis.call('HINCRBY', STATS, 'rank_seq', 1)
  redis.call('ZADD', RANKED, num(score(priority, arrival)), string.format('%016x', seq) .. key)
  redis.call('HSET', RANK, key, priority .. ' ' .. seq)
  redis.call('ZADD', ARRIVALS, num(arrival), key)
  redis.call('HINCRBY', BY_PRIORITY, priority, 1)
end

local function unrank(priority)
  if redis.call('HINCRBY', BY_PRIORITY, priority, -1) <= 0 then
    redis.call('HDEL', BY_PRIORITY, priority)
  end
end

-- Core.rank: the first non-zero priority makes the queue ranked, for good.
-- The waiting keys keep their order and when they arrived (their add, or
-- the done that pushed them back).
local function rank(aging_arg)
  if ranked then
    return
  end
  ranked = true
  aging = tonumber(aging_arg)
  redis.call('HSET', STATS, 'ranked', 1, 'aging', aging_arg)
  for _, key in ipairs(redis.call('LRANGE', FIFO, 0, -1)) do
    rank_insert(key, 0, tonumber(redis.call('HGET', REPUSHED, key) or redis.call('HGET', DIRTY, key)))
  end
  redis.call('DEL', FIFO, REPUSHED)
end

-- Core._get_ranked's pop: the waiting key ranked first and its priority, or nil.
local function rank_pop()
  local popped = redis.call('ZPOPMIN', RANKED)
  if #popped == 0 then
    return nil
  end
  local key = string.sub(popped[1], 17)
  local priority = string.match(redis.call('HGET', RANK, key), '^(%S+)')
  unrank(priority)
  redis.call('HDEL', RANK, key)
  redis.call('ZREM', ARRIVALS, key)
  return key, priority
end

-- Core._promote: a waiting key added with a higher priority moves up,
-- keeping its arrival (and its place among equal scores).
local function promote_priority(key, priority)
  local current, seq = string.match(redis.call('HGET', RANK, key), '^(%S+) (%S+)$')
  if priority <= tonumber(current) then
    return
  end
  local arrival = tonumber(redis.call('ZSCORE', ARRIVALS, key))
  local member = string.format('%016x', tonumber(seq)) .. key
  redis.call('ZADD', RANKED, num(score(priority, arrival)), member)
  redis.call('HSET', RANK, key, priority .. ' ' .. seq)
  unrank(current)
  redis.call('HINCRBY', BY_PRIORITY, priority, 1)
end

-- Ring the doorbell: one getter blocked in BLPOP wakes and runs get.
local function ring()
  if redis.call('RPUSH', BELL, 1) > BELL_CAP then
    redis.call('LTRIM', BELL, -BELL_CAP, -1)
  end
end

-- Append to the waiting set (the FIFO, or ranked), the depth high-water mark,
-- and ring the doorbell. A getter blocked in BLPOP is served the bell element
-- at once; elements left when nobody waits are trimmed, and dropped by the
-- next get that finds nothing waiting.
local function push(key, priority)
  local depth
  if ranked then
    rank_insert(key, priority or 0, now)
    depth = redis.call('ZCARD', RANKED)
  else
    depth = redis.call('RPUSH', FIFO, key)
  end
  if depth > tonumber(redis.call('HGET', STATS, 'max_depth') or 0) then
    redis.call('HSET', STATS, 'max_depth', depth)
  end
  ring()
end

-- Core.add: mark the key dirty; push it only if nobody holds it. 1 if pushed.
-- A key keeps the highest priority it was added with (priority nil: 0).
local function add(key, priority)
  priority = priority or 0
  count('adds')
  if redis.call('HSETNX', DIRTY, key, num(now)) == 0 then
    count('coalesced')
    if ranked then
      if redis.call('HEXISTS', RANK, key) == 1 then
        promote_priority(key, priority)
      elseif priority > tonumber(redis.call('HGET', PENDING_PRIORITY, key) or 0) then
        if priority ~= 0 then
          redis.call('HSET', PENDING_PRIORITY, key, priority)
        else
          redis.call('HDEL', PENDING_PRIORITY, key)
        end
      end
    end
    emit('coalesce', key)
    return 0
  end
  if redis.call('ZSCORE', PROCESSING, key) then
    count('marked_while_processing')
    if priority ~= 0 then
      redis.call('HSET', PENDING_PRIORITY, key, priority)
    end
    emit('mark_while_processing', key)
    return 0
  end
  count('enqueued')
  push(key, priority)
  emit('enqueue', key)
  return 1
end

-- Core.add_after: the key is ready at now + delay; the earliest ready time
-- wins; if that is not later than now (delay <= 0, or a delay too small to
-- move now in floating point) the add rule applies now. kind is 'delay' or
-- 'rate_limit'.
local function add_after(key, delay, kind, priority)
  priority = priority or 0
  count('retries')
  if kind == 'rate_limit' then
    count('rate_limited')
  end
  emit(kind, key, delay)
  if now + delay <= now then
    return add(key, priority)
  end
  if ranked then -- the delayed entry is added with the highest priority asked
    if redis.call('ZSCORE', DELAYED, key) then
      priority = math.max(priority, tonumber(redis.call('HGET', DELAYED_PRIORITY, key) or 0))
    end
    if priority ~= 0 then
      redis.call('HSET', DELAYED_PRIORITY, key, priority)
    else
      redis.call('HDEL', DELAYED_PRIORITY, key)
    end
  end
  local first = redis.call('ZRANGE', DELAYED, 0, 0, 'WITHSCORES')
  if redis.call('ZADD', DELAYED, 'LT', 'CH', num(now + delay), key) == 1 then
    redis.call('HSET', DELAY_SEQ, key, redis.call('HINCRBY', STATS, 'delay_seq', 1))
    if not first[2] or now + delay < tonumber(first[2]) then
      -- The queue's next due time moved earlier: a waiting getter reads it
      -- again and sets its timer (it may wait for a later one).
      ring()
    end
  end
  return 0
end

-- Core.pop_due ("promote"): apply the add rule to every delayed key ready now,
-- in ready-time order, ties in the order their delays were asked for. Every
-- script runs it first, so a due key is in the FIFO before anything else
-- happens, as with the in-memory fronts' timers.
local function promote()
  local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', num(now), 'WITHSCORES', 'LIMIT', 0, BATCH)
  if #due == 0 then
    return
  end
  local entries = {}
  for i = 1, #due, 2 do
    local key = due[i]
    entries[#entries + 1] = { key, tonumber(due[i + 1]), tonumber(redis.call('HGET', DELAY_SEQ, key) or 0) }
  end
  table.sort(entries, function(a, b)
    if a[2] ~= b[2] then
      return a[2] < b[2]
    end
    return a[3] < b[3]
  end)
  for _, entry in ipairs(entries) do
    local priority = 0
    if ranked then
      priority = tonumber(redis.call('HGET', DELAYED_PRIORITY, entry[1]) or 0)
      redis.call('HDEL', DELAYED_PRIORITY, entry[1])
    end
    redis.call('ZREM', DELAYED, entry[1])
    redis.call('HDEL', DELAY_SEQ, entry[1])
    add(entry[1], priority)
  end
end

-- Core.record_failure: false once the key has failed max_retries times
-- (max_retries is '' for none: never gives up, counts nothing).
local function record_failure(key, max_retries)
  if max_retries == '' then
    return true
  end
  return redis.call('HINCRBY', FAILURES, key, 1) < tonumber(max_retries)
end

-- Core.forget, and the server limiter's forget.
local function forget(key)
  redis.call('HDEL', FAILURES, key)
  redis.call('HDEL', REQUEUES, key)
end

-- A token bucket's take (BucketRateLimiter.when): refill since last, take
-- one token, going into debt. Returns tokens, last, and the wait for the debt.
local function take(tokens, last, qps, burst)
  if last ~= nil and now > last then
    tokens = math.min(burst, tokens + (now - last) * qps)
  end
  if last == nil or now > last then
    last = now
  end
  tokens = tokens - 1
  if tokens < 0 then
    return tokens, last, -tokens / qps
  end
  return tokens, last, 0
end

-- EndpointRateLimiter.when: the bucket of one endpoint (starting full), the
-- least recently used endpoint dropped beyond max_endpoints.
local function endpoint_when(name, qps, burst, max_endpoints)
  local tokens, last = burst, nil
  local state = redis.call('HGET', ENDPOINTS, name)
  if state then
    local t, l = string.match(state, '^(%S+) (%S+)$')
    tokens, last = tonumber(t), tonumber(l)
  end
  local delay
  tokens, last, delay = take(tokens, last, qps, burst)
  redis.call('HSET', ENDPOINTS, name, num(tokens) .. ' ' .. num(last))
  redis.call('ZADD', ENDPOINT_LRU, redis.call('HINCRBY', STATS, 'endpoint_seq', 1), name)
  if redis.call('ZCARD', ENDPOINT_LRU) > max_endpoints then
    redis.call('HDEL', ENDPOINTS, redis.call('ZPOPMIN', ENDPOINT_LRU)[1])
  end
  return delay
end

-- The server rate limiter's when(): client-go's default limiter with its
-- state here, shared by every client. The max of
--   ItemExponentialFailureRateLimiter: base * 2^failures, capped (overflow clamped)
--   BucketRateLimiter: qps tokens a second, burst at most, going into debt
--     (rate.Reserve().Delay()); qps '0' means no bucket
--   EndpointRateLimiter: the key's endpoint's bucket, when the client named one
-- limiter is {base, cap, qps, burst} as strings, then optionally {endpoint,
-- endpoint qps, endpoint burst, max endpoints} (endpoint qps '' for none).
local function when(key, limiter)
  local base, cap = tonumber(limiter[1]), tonumber(limiter[2])
  local qps, burst = tonumber(limiter[3]), tonumber(limiter[4])
  local failures = redis.call('HINCRBY', REQUEUES, key, 1) - 1
  local delay = base * 2 ^ math.min(failures, 1023)
  if not (delay <= cap) then
    delay = cap
  end
  if qps > 0 then
    local tokens = tonumber(redis.call('HGET', BUCKET, 'tokens') or burst)
    local last = tonumber(redis.call('HGET', BUCKET, 'last') or '')
    local wait
    tokens, last, wait = take(tokens, last, qps, burst)
    redis.call('HSET', BUCKET, 'tokens', num(tokens), 'last', num(last))
    if wait > delay then
      delay = wait
    end
  end
  if limiter[6] and limiter[6] ~= '' then
    local wait = endpoint_when(limiter[5], tonumber(limiter[6]), tonumber(limiter[7]), tonumber(limiter[8]))
    if wait > delay then
      delay = wait
    end
  end
  return delay
end

-- A lease's fields, as strings (nil if the key is not held): token, the time
-- of its get, the priority it was handed out with, and the seq and result of
-- the last fenced outcome its holder applied.
local function lease_of(key)
  local held = redis.call('HGET', LEASE, key)
  if not held then
    return nil
  end
  local token, started, priority, seq, result = string.match(held, '^(%d+) (%S+) ?(%S*) ?(%S*) ?(%S*)$')
  if priority == '' then -- a hold taken before the outcome fields existed
    priority, seq, result = '0', '0', '-'
  end
  return token, started, priority, seq, result
end

-- Whether the hold with this token is over because reap took its lease back
-- (not because its done ran): the key's highest taken-back token says. (Another
-- token on the key's lease proves nothing: a done of this token may have run,
-- and the key been handed out again since.)
local function taken_back(key, token)
  local last = redis.call('HGET', TAKEN_BACK, key)
  return last ~= false and tonumber(string.match(last, '^(%d+)')) >= tonumber(token)
end

-- A holder learns that its lease was taken back: counted in leases_lost once
-- per taken-back token (its renewal and its outcome may both learn it; the
-- key's record is marked with a '!' once learned).
local function lease_lost(key, token)
  local last = redis.call('HGET', TAKEN_BACK, key)
  if last == token .. '!' then
    return
  end
  if last == token then
    redis.call('HSET', TAKEN_BACK, key, token .. '!')
  end
  count('leases_lost')
end

-- The fence of an outcome (retry, add_after, add_rate_limited, forget) asked
-- by a holder: token '' for a caller that holds nothing (unfenced: 'ok').
-- 'lost' if the hold's lease is not its own any more (counted once: the
-- holder learns it here), 'repeat' and the result it gave if this request
-- (seq, per hold) was applied already (asked again after a lost reply), or
-- 'ok': apply it, then settled().
local function fence(key, token, seq)
  if token == '' then
    return 'ok'
  end
  local held, _, _, applied, result = lease_of(key)
  if held ~= token then
    lease_lost(key, token)
    return 'lost'
  end
  if tonumber(seq) <= tonumber(applied) then
    return 'repeat', tonumber(result)
  end
  return 'ok'
end

-- Record that the holder's request seq was applied, with its result.
local function settled(key, token, seq, result)
  if token == '' then
    return
  end
  local held, started, priority = lease_of(key)
  redis.call('HSET', LEASE, key, table.concat({ held, started, priority, seq, result }, ' '))
end

-- A fenced script's reply: {now, result, events, status}.
local function fenced_reply(status, result)
  return { num(now), result or 0, events, status }
end

-- Core.done, for a holder whose token matched: processing -> absent, or
-- processing + pending -> waiting (pushed once).
local function release(key)
  redis.call('ZREM', PROCESSING, key)
  redis.call('HDEL', LEASE, key)
  if redis.call('HEXISTS', DIRTY, key) == 1 then
    if ranked then
      push(key, tonumber(redis.call('HGET', PENDING_PRIORITY, key) or 0))
      redis.call('HDEL', PENDING_PRIORITY, key)
    else
      push(key)
      redis.call('HSET', REPUSHED, key, num(now))
    end
    count('redeliveries')
    return true
  end
  return false
end

-- reap: every lease expired by now ends as its holder's done would, then
-- counts as one failure of the key: retried through the rate limiter (the add
-- rule, after the backoff), or given up at max_retries (then forgotten). The
-- token is remembered in TAKEN_BACK so the late holder's done raises LeaseLost.
-- limiter is {base, cap, qps, burst}, or {} for a client whose limiter is
-- local: then the key is added again at once.
local function reap(max_retries, limiter)
  local expired = redis.call('ZRANGEBYSCORE', PROCESSING, '-inf', num(now), 'LIMIT', 0, BATCH)
  for _, key in ipairs(expired) do
    local token, started = lease_of(key)
    redis.call('HSET', TAKEN_BACK, key, token)
    count('leases_expired')
    emit('lease_expired', key, now - tonumber(started))
    if release(key) then
      emit('redeliver', key)
    end
    if record_failure(key, max_retries) then
      add_after(key, #limiter > 0 and when(key, limiter) or 0, 'rate_limit')
    else
      forget(key)
      emit('give_up', key)
    end
  end
end

-- Seconds until the next delayed key comes due or the next lease expires
-- ('' if neither): how long a getter may block before something is owed.
local function next_due()
  local first = redis.call('ZRANGE', DELAYED, 0, 0, 'WITHSCORES')
  local lease = redis.call('ZRANGE', PROCESSING, 0, 0, 'WITHSCORES')
  local at = first[2] and tonumber(first[2])
  if lease[2] and (not at or tonumber(lease[2]) < at) then
    at = tonumber(lease[2])
  end
  if not at then
    return ''
  end
  return num(at - now)
end

-- The reap configuration every reaping script takes after its own ARGV:
-- max_retries, then base, cap, qps, burst (all '' for a local limiter).
local function reap_config(first)
  local limiter = {}
  if ARGV[first + 1] ~= '' then
    limiter = { ARGV[first + 1], ARGV[first + 2], ARGV[first + 3], ARGV[first + 4] }
  end
  return ARGV[first], limiter
end
