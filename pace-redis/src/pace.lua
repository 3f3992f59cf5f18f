-- pace's bucket rule (GCRA on one `tat` per key), decided and written in one
-- atomic script call.
--
-- A port of the core's rule (src/rule.rs): each step that computes a rule
-- is tagged `-- rule: <fn>` with the Rust function it ports, and each of
-- those functions names this script. tests/equivalence.rs and
-- tests/holds.rs check that the two agree; DESIGN.md ("Where each rule
-- lives") states where they differ by design (an unresolved hold expires
-- on its own, here, where the core settles it with its lot).
--   gcra          a debit of n: admitted iff debt + n x interval <= tau
--                 (+ a turn's wait); the whole wait otherwise
--   decide_beside the same beside what is held: debt + held + cost
--   fits_beside   a debit fits beside what is held: held + cost <= tau
--   held_wait     a denial's wait while tokens are held: the wait if every
--                 held token were kept now, debt + held + cost - tau
--   slot_of       a turn's wait until its slot: debt + held + cost - tau
--   settle        a kept hold: tat = max(tat, its reading) + cost
--   refunded      a released hold: tat unchanged, held - cost
--   refund        a reserve's refund: prev iff tat is still its own
--
-- The client prepends `local INTERVAL, CAP = <interval ns>, <capacity>`: one
-- script per configuration, so that a call carries only what changes.
--
-- KEYS[1]  the bucket's key
-- reserve: ARGV = {} (n = 1), {n}, or {n, now}: the configuration's quota
-- quota:   ARGV = {'q', n, interval, capacity, wait} or {..., now}: a
--          reserve under the call's own quota (interval ns, capacity) that
--          admits a debit fitting the bucket up to `wait` ns from now (a
--          turn of `acquire`; 0 for a plain reserve). The client checks
--          capacity x interval + wait <= 2^50.
-- refund:  ARGV = {'f', prev, tat} or {'f', prev, tat, now} (prev and tat:
--          the reservation's decimal ns strings)
-- peek:    ARGV = {'p'} or {'p', now}; writes nothing
-- hold:    ARGV = {'h', id, n, interval, capacity, limit} or {..., now}: an
--          exact reservation (README: "Overlapping refunds and holds"):
--          admitted like a reserve of
--          n under the quota (interval ns, capacity), but its cost
--          n x interval is added to the key's held amount, tat untouched;
--          id (hexadecimal, chosen by the client) names it, and it expires
--          `limit` ns after the decision (the client checks limit <= 2^50)
-- keep:    ARGV = {'k', id} or {'k', id, now}: settles hold id from its own
--          reading: tat = max(tat, decided) + cost, held -= cost
-- release: ARGV = {'x', id} or {'x', id, now}: refunds hold id: held -= cost
-- now      the time in ns, injected (tests only, and then no expiry is set:
--          the key's TTL would follow the real clock); otherwise the
--          server's TIME
--
-- Times are u64 nanoseconds since the Unix epoch, stored as decimal strings
-- and handled in Lua as (seconds, nanoseconds) pairs: a Lua number is a
-- double, exact only up to 2^53 (about 104 days of ns). Every number
-- computed below is an integer under 2^53: seconds (< 2^35), nanoseconds of
-- a second (< 1e9), the debt `tat - now` (computed only when
-- 0 <= tat_s - now_s <= MAX_AHEAD_S, so < 2e15 + 1e9), the debt after a
-- debit (adds n * interval <= tau <= 2^50: < 3.2e15) and expiry
-- milliseconds (< 2^45). The client rejects tau > 2^50 (README: "Precision").
-- With holds: held <= 2^50 (an admitted hold keeps d + held <= tau of its
-- quota), so a decision's d + held + n * interval < 4.3e15; a hold limit is
-- at most 2^50 (the client checks it), an expiry is a time like any other.
--
-- Replies (one bulk string: fewer bytes, and cheaper to make, than an
-- array; numbers formatted with %d, never Lua's %.14g):
-- reserve: admitted: the stored tat (decimal ns, the string SET wrote) when
--          the bucket was full before (debt d = 0), else '1 d tat' with d
--          the debt `tat - now` before. The client knows n and the interval
--          the script used, so it derives the rest in u64: the debt after
--          is d + n * interval, now = tat - d - n * interval, prev =
--          tat - n * interval when d > 0 (0: a full bucket), a turn's wait
--          d + n * interval - tau when positive, which the script
--          answers itself (below).
--          Otherwise decimal integers separated by spaces, ending with the
--          time of the decision as (seconds, nanoseconds):
--          '0 wait_ns s ns' denied, wait_ns = d + n * interval - tau (the
--          whole wait); '2 0 s ns' n exceeds the capacity; '3 0 s ns' the
--          stored tat lies more than MAX_AHEAD_S seconds ahead of now (the
--          clock went back).
-- refund and peek replies end with the time of the decision as (seconds,
-- nanoseconds):
-- refund:  {1, s, ns} restored prev; {2, s, ns} the bucket is full: key
--          deleted; {0, s, ns} someone debited since; {3, s, ns} the key
--          is gone (expired: the bucket is full already).
-- peek:    {tat, s, ns, held}, tat '0' for no key (the client computes the
--          debt).
-- A turn admitted after a wait answers '5 wait d held tat': wait the time
-- from the decision to its slot (d + held + n x interval - tau > 0), held
-- what the key holds (0 without holds).
-- A reserve on a key with holds answers an admission as '4 d held tat'
-- (held > 0: the sum of the costs still held, which the decision counted as
-- debt: d + held + n x interval <= tau + wait; a turn also needs held + n
-- x interval <= tau). A denial on a key with holds answers '6 wait d held
-- s ns': wait is the wait if every held token were kept now, d + held + n
-- x interval - tau (the core's `DenyReason::Held`): refunded sooner, the
-- tokens come back sooner; expiring meanwhile, they settle from their
-- expiry and push the retry further.
-- hold:    '1 d held s ns' admitted (d the debt before, held the sum after,
--          this hold included); otherwise as a reserve ('0 wait s ns' or
--          '6 wait d held s ns', '2 0 s ns', '3 0 s ns').
-- keep, release: {1, s, ns} done; {0, s, ns} no such hold (it expired and
--          settled as kept, or the key was lost): nothing changed.
--
-- A key with holds stores 'tat|held|first expiry|last expiry' followed by
-- '|id,cost,decided,expiry' for each hold (decimal ns; tat '0' for a full
-- settled part), in order of expiry. Every call first
-- settles the holds whose expiry has passed, in that order, as kept from
-- their expiry: tat = max(tat, expiry) + cost (a reading after their own:
-- conservative); a call that writes nothing else leaves them stored, and
-- the next call settles them the same way. A key without holds stays one
-- decimal tat, and a reserve, peek or refund on it runs the first branches
-- below, unchanged. The key's expiry covers its holds: max(tat, latest
-- expiry) + held, a time by which settling them all, each from its expiry,
-- leaves a full bucket.

local E9 = 1000000000
local MAX_AHEAD_S = 2000000 -- 2e6 s * 1e9 = 2e15 < 2^51
local key = KEYS[1]
local op = ARGV[1]
local inj
local n, interval, cap, wait
local hid, limit
local now_s, now_n
local cur
if not op then
  -- The common call: a reserve of one token under the configuration's
  -- quota on the server's clock.
  n, interval, cap, wait = 1, INTERVAL, CAP, 0
  op = 'r'
elseif op == 'f' then
  inj = ARGV[4]
elseif op == 'p' then
  inj = ARGV[2]
elseif op == 'q' then
  n = tonumber(ARGV[2])
  interval, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
  wait = tonumber(ARGV[5])
  inj = ARGV[6]
  op = 'r'
elseif op == 'h' then
  hid = ARGV[2]
  n = tonumber(ARGV[3])
  interval, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
  limit = tonumber(ARGV[6])
  wait = 0
  inj = ARGV[7]
elseif op == 'k' or op == 'x' then
  hid = ARGV[2]
  inj = ARGV[3]
elseif op == 'l' then
  -- a lease's take/renew (the section "Leases" at the end)
  inj = ARGV[9]
else
  n = tonumber(op) or 1
  interval, cap, wait = INTERVAL, CAP, 0
  inj = ARGV[2]
  op = 'r'
end

if inj then
  now_s = tonumber(string.sub(inj, 1, -10)) or 0
  now_n = tonumber(string.sub(inj, -9))
else
  -- TIME's strings converted by arithmetic (cheaper than tonumber).
  local t = redis.call('TIME')
  now_s = t[1] + 0
  now_n = t[2] * 1000
end

local fast = op == 'r'
if fast then
  if n > cap then
    return string.format('2 0 %d %d', now_s, now_n)
  end
  cur = redis.call('GET', key)
  if cur and string.find(cur, '%D') then
    -- A key with holds (or something else): the general branch below.
    fast = false
  end
end
if fast then
  local tau = cap * interval
  local d = 0
  if cur then
    if #cur == 0 or #cur > 20 then
      return redis.error_reply('pace: the key holds something other than a tat')
    end
    local ds = (tonumber(string.sub(cur, 1, -10)) or 0) - now_s
    if ds > MAX_AHEAD_S then
      return string.format('3 0 %d %d', now_s, now_n)
    end
    if ds >= 0 then
      d = ds * E9 + (string.sub(cur, -9) - now_n)
      if d < 0 then
        d = 0 -- tat <= now: a full bucket, the same as no key
      end
    end
  end
  if n < 1 then
    return redis.error_reply('pace: n must be at least 1')
  end
  -- rule: gcra
  local nd = d + n * interval
  if nd > tau + wait then
    return string.format('0 %d %d %d', nd - tau, now_s, now_n)
  end
  -- tat = now + nd as (seconds, nanoseconds), without relying on a
  -- rounded division; 0 <= nd < 3.2e15.
  local tat_s, r = now_s, now_n + nd
  if r >= E9 then
    local q = math.floor(r / E9)
    r = r - q * E9
    if r < 0 then
      q = q - 1
      r = r + E9
    elseif r >= E9 then
      q = q + 1
      r = r - E9
    end
    tat_s = tat_s + q
  end
  -- The key expires once its bucket is full: at tat, rounded up to the
  -- millisecond (Redis drops a key when its clock passes it). SET ... PXAT
  -- needs Redis >= 6.2 (or any Valkey).
  local v
  if tat_s == 0 then
    v = string.format('%d', r)
  else
    v = string.format('%d%09d', tat_s, r)
  end
  if inj then
    redis.call('SET', key, v)
  else
    -- The expiry as a %d string (a number argument would be formatted by
    -- Redis with %.17g, which costs more), rounded up with integer
    -- operations (exact: r < 1e9).
    local sub_ms = r % 1000000
    local at_ms = tat_s * 1000 + (r - sub_ms) / 1000000
    if sub_ms > 0 then
      at_ms = at_ms + 1
    end
    redis.call('SET', key, v, 'PXAT', string.format('%d', at_ms))
  end
  if nd > tau then
    -- rule: slot_of (a turn's wait: it fits only after the reading)
    return string.format('5 %d %d 0 %s', nd - tau, d, v)
  end
  if d == 0 then
    return v
  end
  return string.format('1 %d %s', d, v)
end

-- A peek or a reserve's refund on a key without holds (or no key): as
-- before holds existed.
if op == 'p' or op == 'f' then
  cur = redis.call('GET', key)
  if not cur then
    if op == 'p' then
      return {'0', now_s, now_n}
    end
    return {3, now_s, now_n}
  end
  if not string.find(cur, '%D') then
    if #cur == 0 or #cur > 20 then
      return redis.error_reply('pace: the key holds something other than a tat')
    end
    if op == 'p' then
      return {cur, now_s, now_n}
    end
    -- rule: refund
    local prev = ARGV[2]
    local mine = ARGV[3]
    if cur ~= mine then
      return {0, now_s, now_n}
    end
    if prev ~= '0' then
      local ps = tonumber(string.sub(prev, 1, -10)) or 0
      local pn = tonumber(string.sub(prev, -9))
      if ps > now_s or (ps == now_s and pn > now_n) then
        local v
        if ps == 0 then
          v = string.format('%d', pn)
        else
          v = string.format('%d%09d', ps, pn)
        end
        if inj then
          redis.call('SET', key, v)
        else
          redis.call('SET', key, v, 'PXAT', string.format('%d', ps * 1000 + math.ceil(pn / 1000000)))
        end
        return {1, now_s, now_n}
      end
    end
    redis.call('DEL', key)
    return {2, now_s, now_n}
  end
end

-- The general branch: every other call (a key with holds, a hold, a keep or
-- a hold's refund).
-- Times are (seconds, nanoseconds) pairs, as above.
local function split(v)
  return tonumber(string.sub(v, 1, -10)) or 0, tonumber(string.sub(v, -9))
end
-- a > b
local function later(as, an, bs, bn)
  return as > bs or (as == bs and an > bn)
end
-- (s, ns) + d, d an integer with |d| < 2^52
local function add(s, ns, d)
  local total = ns + d
  local q = math.floor(total / E9)
  local r = total - q * E9
  if r < 0 then
    q = q - 1
    r = r + E9
  elseif r >= E9 then
    q = q + 1
    r = r - E9
  end
  return s + q, r
end
local function fmt(s, ns)
  if s == 0 then
    return string.format('%d', ns)
  end
  return string.format('%d%09d', s, ns)
end

if (op == 'r' or op == 'h') and n > cap then
  return string.format('2 0 %d %d', now_s, now_n)
end
if not cur then
  -- (a reserve, a peek or a refund read it already)
  cur = redis.call('GET', key)
end

-- The key's state: its settled tat, what it holds (held, the sum of the
-- live holds' costs) and the live holds themselves, `tail`: one
-- '|id,cost,decided,expiry' each, in order of expiry, whose first and last
-- expiries are (min_s, min_n) and (max_s, max_n). The holds past their
-- expiry are settled first, as kept from their expiry. Only the expired
-- ones and the one a keep or refund names are parsed: string searches and
-- splices do the rest, so a call costs little more with many holds.
local tat_s, tat_n = 0, 0
local held = 0
local tail = ''
local min_s, min_n, max_s, max_n
local changed = false
if cur then
  local t, hs, mins, maxs, at = string.match(cur, '^(%d+)|(%d+)|(%d+)|(%d+)()')
  if t then
    tail = string.sub(cur, at)
    held = tonumber(hs)
    min_s, min_n = split(mins)
    max_s, max_n = split(maxs)
  else
    t = cur
  end
  if #t == 0 or #t > 20 or string.find(t, '%D') or (tail == '' and t ~= cur) then
    return redis.error_reply('pace: the key holds something other than a tat')
  end
  tat_s, tat_n = split(t)
  if tail ~= '' and not later(min_s, min_n, now_s, now_n) then
    -- Expired holds: settled as kept from their expiry, in that order.
    local pos = 1
    while true do
      local cs, e, nxt = string.match(tail, '^|%x+,(%d+),%d+,(%d+)()', pos)
      if not cs then
        if pos <= #tail then
          return redis.error_reply('pace: the key holds something other than a tat')
        end
        break
      end
      local es, en = split(e)
      if later(es, en, now_s, now_n) then
        min_s, min_n = es, en
        break
      end
      -- rule: settle (from its expiry: the core settles a lot from its
      -- end, DESIGN.md "Where each rule lives")
      local c = tonumber(cs)
      if later(es, en, tat_s, tat_n) then
        tat_s, tat_n = es, en
      end
      tat_s, tat_n = add(tat_s, tat_n, c)
      held = held - c
      pos = nxt
      changed = true
    end
    tail = string.sub(tail, pos)
  end
end

-- Where an entry expiring at (es, en) goes in `tail`, which is in order of
-- expiry: after every entry expiring no later (the end if none is later).
-- A hold's entry and a lease's both go there.
local function expiry_pos(es, en)
  local pos = 1
  while true do
    local e, nxt = string.match(tail, '^|%x+,%d+,%d+,(%d+)()', pos)
    if not e then
      return pos
    end
    local ps, pn = split(e)
    if later(ps, pn, es, en) then
      return pos
    end
    pos = nxt
  end
end

-- Writes the state: no key for a full bucket without holds; the key
-- expires when settling every hold from its expiry would leave it full.
local function put()
  if tail == '' then
    if not later(tat_s, tat_n, now_s, now_n) then
      redis.call('DEL', key)
      return
    end
    local v = fmt(tat_s, tat_n)
    if inj then
      redis.call('SET', key, v)
    else
      redis.call('SET', key, v, 'PXAT', string.format('%d', tat_s * 1000 + math.ceil(tat_n / 1000000)))
    end
    return
  end
  local v = fmt(tat_s, tat_n) .. '|' .. string.format('%d', held) .. '|' .. fmt(min_s, min_n) .. '|'
    .. fmt(max_s, max_n) .. tail
  if inj then
    redis.call('SET', key, v)
  else
    local xs, xn = tat_s, tat_n
    if later(max_s, max_n, xs, xn) then
      xs, xn = max_s, max_n
    end
    xs, xn = add(xs, xn, held)
    redis.call('SET', key, v, 'PXAT', string.format('%d', xs * 1000 + math.ceil(xn / 1000000)))
  end
end

if op == 'r' or op == 'h' then
  local d = 0
  local ds = tat_s - now_s
  if ds > MAX_AHEAD_S then
    return string.format('3 0 %d %d', now_s, now_n)
  end
  if ds >= 0 then
    d = ds * E9 + (tat_n - now_n)
    if d < 0 then
      d = 0
    end
  end
  if n < 1 then
    return redis.error_reply('pace: n must be at least 1')
  end
  local tau = cap * interval
  local c = n * interval
  local nd = d + c
  -- rule: decide_beside (max(tat, now) + held + c <= now + tau, + wait for
  -- a turn) and fits_beside (held + c <= tau: a turn goes through at its
  -- slot while those tokens may still be held, and held tokens do not
  -- drain; a call that does not wait meets it anyway)
  if nd + held > tau + wait or held + c > tau then
    if tail == '' then
      return string.format('0 %d %d %d', nd + held - tau, now_s, now_n)
    end
    -- rule: held_wait (the wait if every held token were kept now)
    return string.format('6 %d %d %d %d %d', nd + held - tau, d, held, now_s, now_n)
  end
  if op == 'r' then
    tat_s, tat_n = add(now_s, now_n, nd)
    put()
    local v = fmt(tat_s, tat_n)
    if nd + held > tau then
      -- rule: slot_of (now + nd + held - tau, at or before the settled tat
      -- since held + c <= tau: a decision of the bucket there)
      return string.format('5 %d %d %d %s', nd + held - tau, d, held, v)
    end
    if held > 0 then
      return string.format('4 %d %d %s', d, held, v)
    end
    if d == 0 then
      return v
    end
    return string.format('1 %d %s', d, v)
  end
  if #hid > 32 or not string.match(hid, '^%x+$') then
    return redis.error_reply('pace: a hold id is hexadecimal')
  end
  if string.find(tail, '|' .. hid .. ',', 1, true) then
    return redis.error_reply('pace: duplicate hold id')
  end
  local es, en = add(now_s, now_n, limit)
  local entry = '|' .. hid .. ',' .. string.format('%d', c) .. ',' .. fmt(now_s, now_n) .. ','
    .. fmt(es, en)
  if tail == '' then
    tail = entry
    min_s, min_n, max_s, max_n = es, en, es, en
  elseif not later(max_s, max_n, es, en) then
    tail = tail .. entry
    max_s, max_n = es, en
  else
    -- Expiring before the last (a clock that stepped back, or a shorter
    -- hold limit): in order of expiry, after those expiring no later.
    local pos = expiry_pos(es, en)
    tail = string.sub(tail, 1, pos - 1) .. entry .. string.sub(tail, pos)
    if pos == 1 then
      min_s, min_n = es, en
    end
  end
  held = held + c
  put()
  return string.format('1 %d %d %d %d', d, held, now_s, now_n)
elseif op == 'p' then
  if not cur then
    return {'0', now_s, now_n, 0}
  end
  return {fmt(tat_s, tat_n), now_s, now_n, held}
elseif op == 'f' then
  -- rule: refund (back to prev if the settled tat is still its own)
  if not cur then
    return {3, now_s, now_n}
  end
  local prev = ARGV[2]
  local mine = ARGV[3]
  if fmt(tat_s, tat_n) ~= mine then
    return {0, now_s, now_n}
  end
  local ps, pn = 0, 0
  if prev ~= '0' then
    ps, pn = split(prev)
  end
  -- (a key with holds stays, at prev, as the core's held row does: the
  -- reservation is undone, nothing removed)
  tat_s, tat_n = ps, pn
  put()
  if tail ~= '' or later(ps, pn, now_s, now_n) then
    return {1, now_s, now_n}
  end
  return {2, now_s, now_n}
end

-- Leases (DESIGN.md §11): a port of `pace_models::leases`'s server
-- (`Server::call`, `settle_expired`); tests/lease_equivalence.rs checks
-- the two agree on the same calls at the same readings.
-- lease:   ARGV = {'l', lid, first, kept, released, want, lease, grace} or
--          {..., now}: takes or renews lease lid (24 hexadecimal digits:
--          the replica's id and its lease number) with the replica's
--          cumulative kept and released counts (tokens), asking for want
--          more tokens of the configuration's quota; lease and grace in ns.
--          A lease is a hold of the configuration's interval per held
--          token, stored as '|<lid><kept><released>,cost,born,expiry'
--          (kept and released: 12 hexadecimal digits each; 48 in all, so
--          never a client's hold id) whose expiry is the lease's plus the
--          grace: an expired lease settles as kept from there, as any hold.
-- replies: '8 granted remaining born s ns' (granted: the lease's tokens so
--          far; remaining: its expiry less the reading, ns; born: the
--          reading that created its record); '7 0 s ns' no record and
--          first is '0' (the lease settled at its expiry); '3 0 s ns' as a
--          reserve's.
if op == 'l' then
  local lid = ARGV[2]
  if #lid ~= 24 or not string.match(lid, '^%x+$') then
    return redis.error_reply('pace: a lease id is 24 hexadecimal digits')
  end
  local first = ARGV[3] == '1'
  local rk, rr, want = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local lease, grace = tonumber(ARGV[7]), tonumber(ARGV[8])
  local ds = tat_s - now_s
  if ds > MAX_AHEAD_S then
    return string.format('3 0 %d %d', now_s, now_n)
  end
  -- The lease's record, taken out of the tail (it goes back at its new
  -- expiry).
  local lk, lr, lh, born = 0, 0, 0, nil
  local at = string.find(tail, '|' .. lid, 1, true)
  if at then
    local ks, rs, cs, bs, nxt =
      string.match(tail, '^|%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x(%x%x%x%x%x%x%x%x%x%x%x%x)(%x%x%x%x%x%x%x%x%x%x%x%x),(%d+),(%d+),%d+()', at)
    if not ks then
      return redis.error_reply('pace: the key holds something other than a tat')
    end
    lk, lr, lh, born = tonumber(ks, 16), tonumber(rs, 16), tonumber(cs) / INTERVAL, bs
    tail = string.sub(tail, 1, at - 1) .. string.sub(tail, nxt)
  elseif not first then
    if changed then
      put()
    end
    return string.format('7 0 %d %d', now_s, now_n)
  else
    born = fmt(now_s, now_n)
  end
  -- The report, beyond what the lease applied (a retried call applies
  -- once): kept tokens settle as kept at this reading, released ones go.
  local dk = math.min(math.max(rk - lk, 0), lh)
  local dr = math.min(math.max(rr - lr, 0), lh - dk)
  if dk > 0 then
    -- rule: settle (Server::call: from the call's own reading)
    if later(now_s, now_n, tat_s, tat_n) then
      tat_s, tat_n = now_s, now_n
    end
    tat_s, tat_n = add(tat_s, tat_n, dk * INTERVAL)
    lk = lk + dk
  end
  lr = lr + dr
  lh = lh - dk - dr
  held = held - (dk + dr) * INTERVAL
  -- The grant: up to the room left and a share, at most twice an equal
  -- one while other leases hold tokens.
  local others = 0
  for id, cs in string.gmatch(tail, '|(%x+),(%d+),') do
    if #id == 48 and cs ~= '0' then
      others = others + 1
    end
  end
  local d = 0
  if later(tat_s, tat_n, now_s, now_n) then
    d = (tat_s - now_s) * E9 + (tat_n - now_n)
  end
  local room = math.floor(math.max(CAP * INTERVAL - d - held, 0) / INTERVAL)
  local share = math.max(math.floor(CAP / (2 * (others + 1))), 1)
  local g = math.min(want, room, share)
  lh = lh + g
  held = held + g * INTERVAL
  -- Back in the tail at its expiry (plus the grace), in order of expiry.
  local es, en = add(now_s, now_n, lease + grace)
  local entry = '|' .. lid .. string.format('%012x%012x', lk, lr) .. ','
    .. string.format('%d', lh * INTERVAL) .. ',' .. born .. ',' .. fmt(es, en)
  local pos = expiry_pos(es, en)
  tail = string.sub(tail, 1, pos - 1) .. entry .. string.sub(tail, pos)
  min_s, min_n = split(string.match(tail, '^|%x+,%d+,%d+,(%d+)'))
  max_s, max_n = split(string.match(tail, '(%d+)$'))
  put()
  return string.format('8 %d %d %s %d %d', lk + lr + lh, lease, born, now_s, now_n)
end

-- keep ('k') or release ('x') of hold hid.
local at = string.find(tail, '|' .. hid .. ',', 1, true)
if not at then
  if changed then
    put()
  end
  return {0, now_s, now_n}
end
local hcs, td, nxt = string.match(tail, '^|%x+,(%d+),(%d+),%d+()', at)
if not hcs then
  return redis.error_reply('pace: the key holds something other than a tat')
end
local hc = tonumber(hcs)
local last = nxt > #tail
tail = string.sub(tail, 1, at - 1) .. string.sub(tail, nxt)
if tail ~= '' then
  if at == 1 then
    min_s, min_n = split(string.match(tail, '^|%x+,%d+,%d+,(%d+)'))
  end
  if last then
    max_s, max_n = split(string.match(tail, '(%d+)$'))
  end
end
held = held - hc
-- rule: refunded (a release: the settled tat unchanged)
if op == 'k' then
  -- rule: settle (from its own reading)
  local ts, tn = split(td)
  if later(ts, tn, tat_s, tat_n) then
    tat_s, tat_n = ts, tn
  end
  tat_s, tat_n = add(tat_s, tat_n, hc)
end
put()
return {1, now_s, now_n}
