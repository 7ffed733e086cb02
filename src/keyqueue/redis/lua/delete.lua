-- delete: remove the queue, every key of it (a client's wake-up list expires
-- on its own, within a minute), unless a key is held and the caller did not
-- force it. UNLINK frees a large key's memory off the server's main thread.
-- KEYS: dirty fifo processing lease delayed delay_seq failures requeues stats
--   bell taken_back repushed ranked rank arrivals by_priority pending_priority
--   delayed_priority failing stalls dead dead_info groups fair_keys fair_turns
--   fair_turn_of bucket endpoints endpoint_lru moving imported
-- ARGV: [1] clock, [2] '1' to delete even while keys are held.
-- Returns {now, keys held, 1 if deleted (0: refused, nothing changed), 1 if
-- the queue existed (STATS, or dead keys: RedisWorkQueue.exists)}.
--- @include "base"
local held = redis.call('ZCARD', PROCESSING)
local existed = math.min(redis.call('EXISTS', STATS, DEAD), 1)
if held > 0 and ARGV[2] ~= '1' then
  return { num(now), held, 0, existed }
end
redis.call('UNLINK', DIRTY, FIFO, PROCESSING, LEASE, DELAYED, DELAY_SEQ, FAILURES, REQUEUES,
  BUCKET, STATS, BELL, TAKEN_BACK, REPUSHED, RANKED, RANK, ARRIVALS, BY_PRIORITY,
  PENDING_PRIORITY, DELAYED_PRIORITY, FAILING, ENDPOINTS, ENDPOINT_LRU, STALLS, MOVING, IMPORTED,
  DEAD, DEAD_INFO, GROUPS, FAIR_KEYS, FAIR_TURNS, FAIR_TURN_OF)
return { num(now), held, 1, existed }
