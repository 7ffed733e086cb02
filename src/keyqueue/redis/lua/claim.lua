-- claim: a worker process's round trip: record the starts of holds its
-- workers began, settle the holds it finished (done, or forget and done),
-- then Core.get up to n times, each key with its own lease and fencing token,
-- not started until the client reports it (lib/lease.lua's run). Runs
-- promote and reap as get does. A claim whose reply was lost is recovered:
-- the keys it took, still held with its tokens, are handed back without a
-- failure (no worker of the client started them).
-- KEYS: dirty fifo processing lease delayed delay_seq failures requeues stats
--   bell taken_back repushed ranked rank arrivals by_priority pending_priority
--   delayed_priority failing stalls dead dead_info groups fair_keys fair_turns
--   fair_turn_of
-- and last, KEYS[27]: this client's claim record (a STRING: its last claim's
-- number and the keys and tokens it took, cmsgpack; it expires two leases
-- after the claim; _schema.claim_record).
-- ARGV: [1] clock, [2] lease seconds, [3] reap config (lib/reap.lua
-- reap_config), [4] the caller's holder identity, [5] n: how many keys to
-- take at most (0: only settle), [6] this claim's number (per client),
-- [7] the numbers of earlier claims whose reply was lost, space-separated
-- ('' for none), [8] aging (as add.lua), [9] '1': every event in the
-- reply; '': the poison ones only (nobody listens to the others,
-- lib/events.lua), [10..] the holds to settle, as
-- triples key, token, mode (lib/settle.lua), among them the holds whose
-- handler started, mode 's'; then, from a client with a view of the primary
-- (lib/handout.lua), two more: its token base and the replication id it
-- verified (so #ARGV - 9 is 3k + 2 with a view, 3k without).
-- Returns {now, statuses of the settled holds (in order; none for the
-- starts), the keys taken as key, token pairs, seconds until something comes
-- due ('' if nothing will; only when none was taken), events, the keys taken
-- that have a stall record (their claimant reports their start before their
-- handler runs)}; or the error STALEEPOCH, nothing changed (no settle
-- either), if the node is not the one the view names; or the error
-- MAPCHANGED, nothing changed (lib/map.lua: a sharded client asks again).
--- @include "promote"
--- @include "reap"
--- @include "handout"
--- @include "settle"
--- @include "back"
--- @include "map"
local refused = map_changed(FLAGS[4], FLAGS[5], FLAGS[6]) -- before anything: the settles too
if refused then
  return refused
end
local RECORD = KEYS[#KEYS]
events_quiet = ARGV[9] ~= '1'

-- Hand back what a claim whose reply was lost took and no worker started.
local function recover(lost)
  local packed = redis.call('GET', RECORD)
  if not packed then
    return
  end
  local record = cmsgpack.unpack(packed)
  if not string.find(' ' .. lost .. ' ', ' ' .. record[1] .. ' ', 1, true) then
    return
  end
  for i = 2, #record, 2 do
    local key, token = record[i], record[i + 1]
    local held, started, priority = lease_of(key)
    if held == token then
      hand_back(key, started, priority, ARGV[8])
    end
  end
  redis.call('DEL', RECORD)
end

local settles_end = #ARGV
if (settles_end - 9) % 3 == 2 then
  settles_end = settles_end - 2
  local stale = check_view(settles_end + 1)
  if stale then
    return stale
  end
end
promote()
if ARGV[7] ~= '' then
  recover(ARGV[7])
end
local statuses = settle(10, settles_end)
reap(reap_config(3))
local want = tonumber(ARGV[5])
local handed, suspects = {}, {}
if want > 0 then
  handed, suspects = hand_out(want, tonumber(ARGV[2]), ARGV[4], 'u')
end
local due = ''
if #handed > 0 then
  local record = { ARGV[6] }
  for i = 1, #handed, 2 do
    record[i + 1], record[i + 2] = handed[i], tostring(handed[i + 1])
  end
  redis.call('SET', RECORD, cmsgpack.pack(record), 'PX', math.ceil(2000 * tonumber(ARGV[2])))
end
if #handed < want then
  redis.call('DEL', BELL) -- every element left rang for a key already taken
  if #handed == 0 then
    redis.call('HSETNX', STATS, 'seq', 0) -- a getter used the queue: it exists (STATS)
    due = next_due()
  end
end
return { num(now), statuses, handed, due, events, suspects }
