-- get: Core.get (the FIFO's oldest, or once ranked the first ranked), with a
-- lease and a fencing token. Runs promote and reap first, so any client's get
-- releases due keys and expired leases. A get whose reply was lost is
-- recovered by the next get made in its slot: the key it took, still held
-- with its token, is handed back without a failure (its caller never learned
-- it, so no handler started it). Any other hold counts as started (its
-- caller has the key when get returns): if its holder dies, it is a stall.
-- KEYS: dirty fifo processing lease delayed delay_seq failures requeues stats
--   bell taken_back repushed ranked rank arrivals by_priority pending_priority
--   delayed_priority failing stalls dead dead_info groups fair_keys fair_turns
--   fair_turn_of
-- and last, KEYS[27]: this client's get record (a HASH: slot -> the number of
-- the last get made in the slot that took a key, the key and its token,
-- cmsgpack; it expires two leases after that get; _schema.get_record). A
-- client makes its gets in slots, one get at a time in each (as many slots as
-- it has gets in flight at once).
-- ARGV: [1] clock, [2] lease seconds, [3] reap config (lib/reap.lua
-- reap_config), [4] the caller's holder identity (recorded with the lease),
-- [5] this get's slot, [6] its number (per client), [7] the numbers of the
-- gets made in the slot since the last one answered, space-separated ('' if
-- none: the last one answered), [8] aging (as add.lua), [9] '1' to hand
-- back only (a client shutting down: it takes no key), else ''; and from a
-- client with a view of the primary (lib/handout.lua), [10] its token base
-- and [11] the replication id it verified.
-- Returns {now, 1, key, token, events} or, when nothing waits,
-- {now, 0, seconds until something comes due ('' if nothing will), events}
-- (a flag, not an empty key, says which: '' is a key like any other); the
-- error STALEEPOCH, nothing changed, if the node is not the one the view
-- names.
-- Or the error MAPCHANGED, nothing taken (lib/map.lua; a lost get's key is
-- handed back first: it is held here).
--- @include "promote"
--- @include "reap"
--- @include "handout"
--- @include "back"
--- @include "map"
local RECORD = KEYS[#KEYS]
local slot = ARGV[5]

-- Hand back what the slot's last get that took a key took, if that is one
-- of the gets not answered (its reply was lost) and the key is still held
-- with its token. (The gets of a slot run one after another, each recording
-- over the last: a get not answered that ran handed back the one before.)
local function recover(lost)
  local packed = redis.call('HGET', RECORD, slot)
  if not packed then
    return
  end
  local record = cmsgpack.unpack(packed)
  if not string.find(' ' .. lost .. ' ', ' ' .. record[1] .. ' ', 1, true) then
    return
  end
  local held, started, priority = lease_of(record[2])
  if held == record[3] then
    hand_back(record[2], started, priority, ARGV[8])
  end
end

local stale = check_view(10)
if stale then
  return stale
end
promote()
if ARGV[7] ~= '' then
  recover(ARGV[7])
end
if ARGV[9] == '1' then
  return { num(now), 0, '', events }
end
local refused = map_changed(FLAGS[4], FLAGS[5], FLAGS[6]) -- a hand-back above is this shard's
if refused then
  return refused
end
reap(reap_config(3))
local handed = hand_out(1, tonumber(ARGV[2]), ARGV[4], 's')
if #handed == 0 then
  redis.call('DEL', BELL) -- every element left rang for a key already taken
  redis.call('HSETNX', STATS, 'seq', 0) -- a getter used the queue: it exists (STATS)
  return { num(now), 0, next_due(), events }
end
redis.call('HSET', RECORD, slot, cmsgpack.pack({ ARGV[6], handed[1], tostring(handed[2]) }))
redis.call('PEXPIRE', RECORD, math.ceil(2000 * tonumber(ARGV[2])))
return { num(now), 1, handed[1], handed[2], events }
