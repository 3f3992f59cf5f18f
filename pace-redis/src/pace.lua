-- pace's bucket rule (GCRA on one `tat` per key), decided and written in one
-- atomic script call.
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
--
-- Replies (one bulk string: fewer bytes, and cheaper to make, than an
-- array; numbers formatted with %d, never Lua's %.14g):
-- reserve: admitted: the stored tat (decimal ns, the string SET wrote) when
--          the bucket was full before (debt d = 0), else '1 d tat' with d
--          the debt `tat - now` before. The client knows n and the interval
--          the script used, so it derives the rest in u64: the debt after
--          is d + n * interval, now = tat - d - n * interval, prev =
--          tat - n * interval when d > 0 (0: a full bucket), a turn's wait
--          d + n * interval - tau when positive.
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
-- peek:    {tat, s, ns}, tat '0' for no key (the client computes the debt).

local E9 = 1000000000
local MAX_AHEAD_S = 2000000 -- 2e6 s * 1e9 = 2e15 < 2^51
local key = KEYS[1]
local op = ARGV[1]
local inj
local n, interval, cap, wait
if op == 'f' then
  inj = ARGV[4]
elseif op == 'p' then
  inj = ARGV[2]
elseif op == 'q' then
  n = tonumber(ARGV[2])
  interval, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
  wait = tonumber(ARGV[5])
  inj = ARGV[6]
  op = 'r'
else
  n = tonumber(op) or 1
  interval, cap, wait = INTERVAL, CAP, 0
  inj = ARGV[2]
  op = 'r'
end

local now_s, now_n
if inj then
  now_s = tonumber(string.sub(inj, 1, -10)) or 0
  now_n = tonumber(string.sub(inj, -9))
else
  local t = redis.call('TIME')
  now_s = tonumber(t[1])
  now_n = tonumber(t[2]) * 1000
end

if op == 'r' then
  local tau = cap * interval
  if n > cap then
    return string.format('2 0 %d %d', now_s, now_n)
  end
  local cur = redis.call('GET', key)
  local d = 0
  if cur then
    if #cur == 0 or #cur > 20 or string.find(cur, '%D') then
      return redis.error_reply('pace: the key holds something other than a tat')
    end
    local ds = (tonumber(string.sub(cur, 1, -10)) or 0) - now_s
    if ds > MAX_AHEAD_S then
      return string.format('3 0 %d %d', now_s, now_n)
    end
    if ds >= 0 then
      d = ds * E9 + (tonumber(string.sub(cur, -9)) - now_n)
      if d < 0 then
        d = 0 -- tat <= now: a full bucket, the same as no key
      end
    end
  end
  if n < 1 then
    return redis.error_reply('pace: n must be at least 1')
  end
  local nd = d + n * interval
  if nd > tau + wait then
    return string.format('0 %d %d %d', nd - tau, now_s, now_n)
  end
  -- tat = now + nd, normalised to (seconds, nanoseconds) without relying on
  -- a rounded division.
  local total = now_n + nd
  local q = math.floor(total / E9)
  local r = total - q * E9
  if r < 0 then
    q = q - 1
    r = r + E9
  elseif r >= E9 then
    q = q + 1
    r = r - E9
  end
  local tat_s = now_s + q
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
    -- The expiry as a %d string: a number argument would be formatted by
    -- Redis with %.17g, which costs more.
    redis.call('SET', key, v, 'PXAT', string.format('%d', tat_s * 1000 + math.ceil(r / 1000000)))
  end
  if d == 0 then
    return v
  end
  return string.format('1 %d %s', d, v)
elseif op == 'p' then
  local cur = redis.call('GET', key)
  if not cur then
    return {'0', now_s, now_n}
  end
  if #cur == 0 or #cur > 20 or string.find(cur, '%D') then
    return redis.error_reply('pace: the key holds something other than a tat')
  end
  return {cur, now_s, now_n}
else
  -- Stores a tat (s, n) as its decimal string, expiring as in reserve.
  local function store(s, n)
    local v
    if s == 0 then
      v = string.format('%d', n)
    else
      v = string.format('%d%09d', s, n)
    end
    if inj then
      redis.call('SET', key, v)
    else
      redis.call('SET', key, v, 'PXAT', string.format('%d', s * 1000 + math.ceil(n / 1000000)))
    end
    return v
  end
  local prev = ARGV[2]
  local mine = ARGV[3]
  local cur = redis.call('GET', key)
  if not cur then
    return {3, now_s, now_n}
  end
  if cur ~= mine then
    return {0, now_s, now_n}
  end
  if prev ~= '0' then
    local ps = tonumber(string.sub(prev, 1, -10)) or 0
    local pn = tonumber(string.sub(prev, -9))
    if ps > now_s or (ps == now_s and pn > now_n) then
      store(ps, pn)
      return {1, now_s, now_n}
    end
  end
  redis.call('DEL', key)
  return {2, now_s, now_n}
end
