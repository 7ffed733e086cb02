-- holdings: what a reshard reads of a shard: every key with state here
-- (dirty, held, delayed, failures, requeues, failing, taken back, stalls),
-- the held ones among them, the keys exported and not yet finished, and
-- the shard's seq (every token handed out here so far is at most it).
-- O(keys) in one step: a mover reads each old shard so, once a pass.
-- KEYS: dirty processing delayed failures requeues stats taken_back failing
--   stalls moving
-- ARGV: none.
-- Returns {keys with state, held keys, keys in MOVING, seq}.
local seen, keys = {}, {}
local function note(list)
  for _, key in ipairs(list) do
    if not seen[key] then
      seen[key] = true
      keys[#keys + 1] = key
    end
  end
end
note(redis.call('HKEYS', DIRTY))
note(redis.call('ZRANGE', PROCESSING, 0, -1))
note(redis.call('ZRANGE', DELAYED, 0, -1))
note(redis.call('HKEYS', FAILURES))
note(redis.call('HKEYS', REQUEUES))
note(redis.call('HKEYS', TAKEN_BACK))
note(redis.call('ZRANGE', FAILING, 0, -1))
note(redis.call('HKEYS', STALLS))
return { keys, redis.call('ZRANGE', PROCESSING, 0, -1), redis.call('HKEYS', MOVING),
  redis.call('HGET', STATS, 'seq') or '0' }
