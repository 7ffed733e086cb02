-- idle: what join reads: is anything waiting or pending, held or delayed?
-- Three O(1) reads, atomic (a key moving between them cannot hide), no change.
-- KEYS: dirty processing delayed
-- ARGV: none.
-- Returns {dirty keys (waiting or pending), held keys, delayed keys}: the
-- queue is idle when all three are 0.
return {redis.call('HLEN', DIRTY), redis.call('ZCARD', PROCESSING), redis.call('ZCARD', DELAYED)}
