-- snapshot: Core.snapshot, the stats and the first keys of the five lists, in
-- one step. It changes nothing (no promote, no reap: a reader does not act on
-- the queue with its own max_retries and limiter), so a key due but not yet
-- promoted is still delayed, an expired lease not yet reaped still held. Each
-- list is a range read from its head (ZRANGE, LRANGE with limits) and a few
-- calls for all its rows (HMGET, ZMSCORE): O(limit + log n), however many
-- keys the queue has.
-- KEYS: dirty fifo processing lease delayed delay_seq stats taken_back repushed
--   ranked rank arrivals by_priority delayed_priority failing dead dead_info
--   groups fair_keys fair_turns fair_turn_of
-- ARGV: [1] clock, [2] limit (rows per list; 0: none).
-- Returns {summary() (lib/summary.lua), waiting, processing, delayed, failing,
-- how many keys have failures, dead}, each list flat, in its order:
--   waiting    key, priority, arrival (when it entered the waiting set);
--   processing key, holder, token, time of its get, lease expiry (soonest first);
--   delayed    key, ready time, priority, delay seq (soonest first);
--   failing    key, failures, ready time if delayed else '' (most first);
--   dead       key, when given up, its entry (lib/dead.lua; newest first,
--              none older than DEAD_MAX_AGE).
--- @include "lease"
--- @include "summary"
--- @include "fair"
--- @include "dead"
local last = tonumber(ARGV[2]) - 1
if last < 0 then -- ZRANGE's stop -1 would be the whole list
  return { summary({}), {}, {}, {}, {}, redis.call('ZCARD', FAILING), {} }
end

-- FairWaiting.first: get's next keys in a fair queue, the rotation played on
-- copies of what it needs: the first limit keys by rank (the first by rank
-- after i hand-outs is among the first i + 1), the first limit turns of each
-- priority met, the first limit keys of each group met.
local function fair_first()
  local by_rank = {}
  for i, member in ipairs(redis.call('ZRANGE', RANKED, 0, last)) do
    by_rank[i] = string.sub(member, 17)
  end
  local ranks = each_of('HMGET', RANK, by_rank)
  local taken, turns, queues, left = {}, {}, {}, {}
  local keys, priorities = {}, {}
  local at = 1
  while #keys <= last and at <= #by_rank do
    local top = by_rank[at]
    if taken[top] then
      at = at + 1
    else
      local priority = string.match(ranks[at], '^(%S+)')
      local rotation = turns[priority]
      if not rotation then
        rotation = {}
        for _, turn in ipairs(redis.call('ZRANGE', FAIR_TURNS, '[' .. priority .. ' ', '(' .. priority .. ' g',
          'BYLEX', 'LIMIT', 0, last + 1)) do
          rotation[#rotation + 1] = priority .. ' ' .. string.sub(turn, #priority + 18)
        end
        turns[priority] = rotation
      end
      local group = table.remove(rotation, 1)
      local key = top -- a priority without turns: RANKED's first, as fair_pop
      if group then
        local queue = queues[group]
        if not queue then
          queue = {}
          for _, member in ipairs(redis.call('ZRANGE', FAIR_KEYS, '[' .. group, '(' .. group .. 'g', 'BYLEX',
            'LIMIT', 0, last + 1)) do
            queue[#queue + 1] = string.sub(member, #group + 17)
          end
          queues[group] = queue
          left[group] = redis.call('ZLEXCOUNT', FAIR_KEYS, '[' .. group, '(' .. group .. 'g')
        end
        key = table.remove(queue, 1)
        left[group] = left[group] - 1
        if left[group] > 0 then
          rotation[#rotation + 1] = group
        end
      end
      if key and not taken[key] then
        taken[key] = true
        keys[#keys + 1] = key
        priorities[#keys] = priority
      end
    end
  end
  local rows = {}
  local arrivals = each_of('ZMSCORE', ARRIVALS, keys)
  for i, key in ipairs(keys) do
    rows[#rows + 1] = key
    rows[#rows + 1] = priorities[i]
    rows[#rows + 1] = arrivals[i]
  end
  return rows
end

local waiting = {}
if fair then
  waiting = fair_first()
elseif ranked then
  local keys = {}
  for i, member in ipairs(redis.call('ZRANGE', RANKED, 0, last)) do
    keys[i] = string.sub(member, 17)
  end
  local ranks, arrivals = each_of('HMGET', RANK, keys), each_of('ZMSCORE', ARRIVALS, keys)
  for i, key in ipairs(keys) do
    waiting[#waiting + 1] = key
    waiting[#waiting + 1] = string.match(ranks[i], '^(%S+)')
    waiting[#waiting + 1] = arrivals[i]
  end
else
  local keys = redis.call('LRANGE', FIFO, 0, last)
  local pushed_back, dirty = each_of('HMGET', REPUSHED, keys), each_of('HMGET', DIRTY, keys)
  for i, key in ipairs(keys) do
    waiting[#waiting + 1] = key
    waiting[#waiting + 1] = '0'
    waiting[#waiting + 1] = pushed_back[i] or dirty[i]
  end
end

local function split(pairs_)
  local keys, scores = {}, {}
  for i = 1, #pairs_, 2 do
    keys[#keys + 1] = pairs_[i]
    scores[#scores + 1] = pairs_[i + 1]
  end
  return keys, scores
end

local processing = {}
local held, expiries = split(redis.call('ZRANGE', PROCESSING, 0, last, 'WITHSCORES'))
local leases = each_of('HMGET', LEASE, held)
for i, key in ipairs(held) do
  local token, started, _, _, _, holder = parse_lease(leases[i]) -- a hold has a lease
  processing[#processing + 1] = key
  processing[#processing + 1] = holder or ''
  processing[#processing + 1] = token or '0'
  processing[#processing + 1] = started or expiries[i]
  processing[#processing + 1] = expiries[i]
end

local delayed = {}
local due, ready = split(redis.call('ZRANGE', DELAYED, 0, last, 'WITHSCORES'))
local priorities, seqs = each_of('HMGET', DELAYED_PRIORITY, due), each_of('HMGET', DELAY_SEQ, due)
for i, key in ipairs(due) do
  delayed[#delayed + 1] = key
  delayed[#delayed + 1] = ready[i]
  delayed[#delayed + 1] = priorities[i] or '0'
  delayed[#delayed + 1] = seqs[i] or '0'
end

local failing = {}
local failed, counts = split(redis.call('ZRANGE', FAILING, 0, last, 'REV', 'WITHSCORES'))
local back = each_of('ZMSCORE', DELAYED, failed)
for i, key in ipairs(failed) do
  failing[#failing + 1] = key
  failing[#failing + 1] = counts[i]
  failing[#failing + 1] = back[i] or ''
end

local dead = {}
local buried, times = split(newest_dead(last + 1))
local entries = each_of('HMGET', DEAD_INFO, buried)
for i, key in ipairs(buried) do
  dead[#dead + 1] = key
  dead[#dead + 1] = times[i]
  dead[#dead + 1] = entries[i]
end

return { summary({}), waiting, processing, delayed, failing, redis.call('ZCARD', FAILING), dead }
