-- pace's bucket rule (GCRA on one `tat` per key), decided and written in one
-- atomic script call.
--
-- KEYS[1]  the bucket's key
-- ARGV[1]  'r' (reserve) or 'f' (refund)
-- reserve: ARGV[2] n, ARGV[3] interval ns, ARGV[4] capacity
-- refund:  ARGV[2] prev, ARGV[3] the reservation's tat (decimal ns strings)
-- peek:    ARGV[1] 'p', nothing else; writes nothing
-- ARGV[5]  '' to read the server's TIME; otherwise the time in ns (tests only,
--          and then no expiry is set: the key's TTL would follow the real clock)
--
-- Times are u64 nanoseconds since the Unix epoch, stored and returned as
-- decimal strings and handled in Lua as (seconds, nanoseconds) pairs: a Lua
-- number is a double, exact only up to 2^53 (about 104 days of ns). Every
-- number computed below is an integer under 2^53: seconds (< 2^35),
-- nanoseconds of a second (< 1e9), the debt `tat - now` (computed only when
-- 0 <= tat_s - now_s <= MAX_AHEAD_S, so < 2e15 + 1e9), the debt after a debit
-- (adds n * interval <= tau <= 2^50: < 3.2e15) and expiry milliseconds
-- (< 2^45). The client rejects tau > 2^50 (README: "Precision").
--
-- Replies:
-- reserve: {1, prev, tat, now} admitted; {0, wait_ns, now} denied;
--          {2, 0, now} n exceeds the capacity; {3, 0, now} the stored tat lies
--          more than MAX_AHEAD_S seconds ahead of now (the clock went back).
-- refund:  {1, now} restored prev; {2, now} the bucket is full: key deleted;
--          {0, now} someone debited since (or the key is gone): nothing.
-- peek:    {tat, now}, tat '0' for no key (the client computes the debt).

local E9 = 1000000000
local MAX_AHEAD_S = 2000000 -- 2e6 s * 1e9 = 2e15 < 2^51
local key = KEYS[1]
local op = ARGV[1]
local injected = ARGV[5] ~= ''

local function parse(s)
  -- "SSSSSSSSSSNNNNNNNNN" -> seconds, nanoseconds (each exact in a double)
  return tonumber(string.sub(s, 1, -10)) or 0, tonumber(string.sub(s, -9))
end

local function fmt(s, n)
  if s == 0 then
    return string.format('%d', n)
  end
  return string.format('%d%09d', s, n)
end

local now_s, now_n
if injected then
  now_s, now_n = parse(ARGV[5])
else
  local t = redis.call('TIME')
  now_s = tonumber(t[1])
  now_n = tonumber(t[2]) * 1000
end
local now = fmt(now_s, now_n)

-- Stores a tat (s, n); the key expires once its bucket is full (Redis drops
-- a key when its clock passes the millisecond; the ceiling keeps it at least
-- until tat). SET ... PXAT needs Redis >= 6.2 (or any Valkey).
local function store(s, n)
  if injected then
    redis.call('SET', key, fmt(s, n))
  else
    redis.call('SET', key, fmt(s, n), 'PXAT', s * 1000 + math.ceil(n / 1000000))
  end
end

if op == 'r' then
  local n = tonumber(ARGV[2])
  local interval = tonumber(ARGV[3])
  local cap = tonumber(ARGV[4])
  local tau = cap * interval
  if n > cap then
    return {2, 0, now}
  end
  local cur = redis.call('GET', key)
  local d = 0
  local prev = '0'
  if cur then
    if not string.find(cur, '^%d+$') or #cur > 20 then
      return redis.error_reply('pace: the key holds something other than a tat')
    end
    local ts, tn = parse(cur)
    local ds = ts - now_s
    if ds > MAX_AHEAD_S then
      return {3, 0, now}
    end
    if ds >= 0 then
      d = ds * E9 + (tn - now_n)
    end
    if d > 0 then
      prev = cur
    else
      d = 0 -- tat <= now: a full bucket, the same as no key
    end
  end
  if n == 0 then
    return {1, prev, prev, now}
  end
  local nd = d + n * interval
  if nd > tau then
    return {0, nd - tau, now}
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
  store(tat_s, r)
  return {1, prev, fmt(tat_s, r), now}
elseif op == 'p' then
  local cur = redis.call('GET', key)
  if not cur then
    return {'0', now}
  end
  if not string.find(cur, '^%d+$') or #cur > 20 then
    return redis.error_reply('pace: the key holds something other than a tat')
  end
  return {cur, now}
elseif op == 'f' then
  local prev = ARGV[2]
  local mine = ARGV[3]
  local cur = redis.call('GET', key)
  if cur ~= mine then
    return {0, now}
  end
  if prev ~= '0' then
    local ps, pn = parse(prev)
    if ps > now_s or (ps == now_s and pn > now_n) then
      store(ps, pn)
      return {1, now}
    end
  end
  redis.call('DEL', key)
  return {2, now}
end
return redis.error_reply('pace: unknown op')
