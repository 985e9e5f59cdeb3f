-- take.lua decides batches of sluice rate limit requests atomically. It
-- reproduces the Go transitions of package sluice exactly: the same integer
-- arithmetic on microseconds, done in Lua's doubles, which hold integers
-- exactly below 2^53. The Go side (script.go) checks the bounds that keep
-- every intermediate value below that and reduces the bucket arithmetic by
-- gcd(rate, period).
--
-- KEYS: one key per request, in order.
-- ARGV[1]: now, in µs since the Unix epoch, or "" to read Redis's TIME
--          (once per call: every request of the call decides at that time).
-- ARGV[2]: milliseconds a key lives past its reset time.
-- ARGV[3]: the requests, packed (little-endian; one string, so that Redis
--          parses one argument, not six per request). Groups, each a header
--          '<Bi4' (mode, n) and n requests '<Bddddd' (alg, a, b, c, d, cost):
--   alg 0 fixed_window, 1 sliding_window, 2 sliding_log: a = rate, b = period
--   alg 3 token_bucket, 4 leaky_bucket: a = rate/g, b = period/g,
--       c = capacity, d = g = gcd(rate, period)
--   alg 5 gcra: a = T (emission interval), b = tolerance, c = capacity
-- mode 0: each request is applied and written at once (Take).
-- mode 1: the requests are decided in order on working copies (a key given
--         twice sees the first request's hits) and written only if all
--         are allowed (TakeAll).
-- mode 2: decided as mode 1 and never written (a dry run).
--
-- Returns one string: per request '<Bdddd': allowed (1 or 0), remaining,
-- reset after (µs), retry after (µs, -1 for never), wait (µs,
-- leaky_bucket).
--
-- State: fixed_window, sliding_window, token_bucket, leaky_bucket and gcra
-- keep a 25-byte string, struct '<Bddd': algorithm, t, n, x (the previous
-- window's count, or the bucket's g). sliding_log keeps a list: a header
-- '<Bdd' (algorithm, latest time, sum) and then one '<dd' (time, hits) per
-- admitted request, oldest first. A key found under another algorithm (or
-- of another type) starts afresh. Every write sets a TTL (PSETEX, PEXPIRE) of the reset
-- time plus ARGV[2], so Redis forgets keys once they are as good as new.
--
-- Cost: a call reads all string states with one MGET, and then makes one
-- PSETEX per request that changes its key, about 2 of the 4 µs of Redis
-- CPU a decision costs; so a batch does not call GET per request.

local floor, max = math.floor, math.max
local spack, sunpack = struct.pack, struct.unpack
local TWO52 = 4503599627370496

-- divmod returns q = ⌊a/b⌋ and r = a − q·b, 0 <= r < b, for integers
-- |a| <= 2^52 and 0 < b <= 2^52: the quotient of the doubles may be off by
-- one near an integer, and the remainder, which is exact, corrects it.
local function divmod(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then
    q, r = q - 1, r + b
  elseif r >= b then
    q, r = q + 1, r - b
  end
  return q, r
end

-- ceildiv returns ⌈a/b⌉ for 0 <= a <= 2^52, 0 < b <= 2^52.
local function ceildiv(a, b)
  local q, r = divmod(a, b)
  if r > 0 then q = q + 1 end
  return q
end

-- muldiv returns q = ⌊a·b/c⌋ and r = a·b − q·c for 0 <= a, b < 2^53 and
-- 0 < c <= 2^52 with q < 2^53, exactly, also when a·b is past 2^53: then it
-- goes through b's bits, keeping a·(b's leading bits) = q·c + r, r < c.
local function muldiv(a, b, c)
  local p = a * b
  if p <= TWO52 then return divmod(p, c) end
  local qa, ra = divmod(a, c)
  local q, r, bit = 0, 0, 1
  while bit * 2 <= b do bit = bit * 2 end
  while bit >= 1 do
    q, r = q * 2, r * 2
    if r >= c then q, r = q + 1, r - c end
    if b >= bit then
      b = b - bit
      q, r = q + qa, r + ra
      if r >= c then q, r = q + 1, r - c end
    end
    bit = bit / 2
  end
  return q, r
end

-- windowStart mirrors sluice.windowStart.
local function windowStart(now, period, known)
  if now >= known and now - known < period then return known end
  local _, m = divmod(now, period)
  return now - m
end

-- String states -------------------------------------------------------------

-- loadString decodes v, the key's value (false for none or a list, the
-- state of a sliding log: SET later replaces the list).
local function loadString(v, alg)
  if v and #v == 25 then
    local a, t, n, x = sunpack('<Bddd', v)
    if a == alg then return { t = t, n = n, x = x, orig = v, alg = alg, reset = 0 } end
  end
  return { t = 0, n = 0, x = 0, orig = v, alg = alg, reset = 0 }
end

local function saveString(key, alg, s, ttl, cur)
  local v = spack('<Bddd', alg, s.t, s.n, s.x)
  if v ~= s.orig then
    redis.call('PSETEX', key, ttl, v)
    s.orig = v
    cur[key] = v
  end
end

-- Sliding logs ---------------------------------------------------------------

local CHUNK = 64

local function loadLog(key)
  local L = { key = key, t = 0, sum = 0, h = 1, len = 0, app = {}, cache = {},
    merge = false, changed = false, wrong = false, alg = 2, reset = 0 }
  local hdr = redis.pcall('LINDEX', key, 0)
  if type(hdr) == 'table' then -- WRONGTYPE: a string state of another algorithm
    L.wrong = true
    return L
  end
  if hdr and #hdr == 17 then
    local a, t, sum = sunpack('<Bdd', hdr)
    if a == 2 then
      L.t, L.sum, L.len = t, sum, redis.call('LLEN', key)
      return L
    end
  end
  if hdr then L.wrong = true end
  return L
end

-- entry returns {t, n} of the stored entry at list index i, 1 <= i < L.len.
local function entry(L, i)
  local e = L.cache[i]
  if not e then
    local vs = redis.call('LRANGE', L.key, i, i + CHUNK - 1)
    for j = 1, #vs do
      local t, n = sunpack('<dd', vs[j])
      L.cache[i + j - 1] = { t, n }
    end
    e = L.cache[i]
  end
  return e
end

local function expireLog(L, cutoff)
  while L.h < L.len do
    local e = entry(L, L.h)
    if e[1] > cutoff then break end
    L.sum = L.sum - e[2]
    L.h = L.h + 1
    L.changed = true
  end
  -- Appended entries are at this call's now, later than any cutoff.
end

local function lastLog(L)
  local k = #L.app
  if k > 0 then return L.app[k][1] end
  if L.h < L.len then return entry(L, L.len - 1)[1] end
  return nil
end

local function addLog(L, t, n)
  L.sum = L.sum + n
  L.changed = true
  local k = #L.app
  if k > 0 then
    if L.app[k][1] == t then
      L.app[k][2] = L.app[k][2] + n
      return
    end
  elseif L.h < L.len then
    local e = entry(L, L.len - 1)
    if e[1] == t then
      e[2] = e[2] + n
      L.merge = true
      return
    end
  end
  L.app[k + 1] = { t, n }
end

local function passesLog(L, most)
  local sum = L.sum
  for i = L.h, L.len - 1 do
    local e = entry(L, i)
    sum = sum - e[2]
    if sum <= most then return e[1] end
  end
  for _, e in ipairs(L.app) do
    sum = sum - e[2]
    if sum <= most then return e[1] end
  end
  return 0
end

local function saveLog(L, ttl)
  if not L.changed then return end
  local key = L.key
  local hdr = spack('<Bdd', 2, L.t, L.sum)
  if L.wrong then
    redis.call('DEL', key)
    L.len, L.h, L.wrong = 0, 1, false
  end
  if L.len == 0 then
    redis.call('RPUSH', key, hdr)
  elseif L.h > 1 then
    redis.call('LTRIM', key, L.h, -1)
    redis.call('LPUSH', key, hdr)
  else
    redis.call('LSET', key, 0, hdr)
  end
  if L.merge then
    local e = entry(L, L.len - 1)
    redis.call('LSET', key, -1, spack('<dd', e[1], e[2]))
  end
  local k = #L.app
  if k > 0 then
    local vs = {}
    for i = 1, k do vs[i] = spack('<dd', L.app[i][1], L.app[i][2]) end
    redis.call('RPUSH', key, unpack(vs))
  end
  redis.call('PEXPIRE', key, ttl)
end

-- The algorithms: each mirrors its Go transition line by line and returns
-- allowed, remaining, reset after, retry after (-1: never), wait.

local function fixedWindow(s, rate, period, now, cost)
  local ws = windowStart(now, period, s.t)
  if ws < s.t then ws = s.t end
  if ws ~= s.t then s.t, s.n = ws, 0 end
  local stop = ws + period
  local allowed, retry, reset = 0, 0, 0
  if cost <= rate - s.n then
    s.n = s.n + cost
    allowed = 1
  elseif cost > rate then
    retry = -1
  else
    retry = stop - now
  end
  if s.n > 0 then reset = stop - now end
  return allowed, max(rate - s.n, 0), reset, retry, 0
end

local function weigh(count, left, period)
  if count <= 0 or left <= 0 then return 0 end
  local q, r = muldiv(count, left, period)
  if r ~= 0 then q = q + 1 end
  return q
end

local function leftFor(count, k, period)
  if count <= k then return period end
  return (muldiv(k, period, count))
end

local function slidingWindow(s, rate, period, now, cost)
  local ws = windowStart(now, period, s.t)
  if ws < s.t then ws, now = s.t, s.t end
  if ws == s.t then
  elseif ws == s.t + period then
    s.t, s.x, s.n = ws, s.n, 0
  else
    s.t, s.x, s.n = ws, 0, 0
  end
  local elapsed = now - ws
  local free = rate - s.n - weigh(s.x, period - elapsed, period)
  local allowed, retry, reset = 0, 0, 0
  if cost <= free then
    s.n = s.n + cost
    free = free - cost
    allowed = 1
  elseif cost > rate then
    retry = -1
  else
    local k = rate - s.n - cost
    if k >= 0 then
      retry = period - leftFor(s.x, k, period) - elapsed
    else
      retry = 2 * period - leftFor(s.n, rate - cost, period) - elapsed
    end
  end
  if s.n > 0 then
    reset = ws + 2 * period - now
  elseif s.x > 0 then
    reset = ws + period - now
  end
  return allowed, max(free, 0), reset, retry, 0
end

local function slidingLog(L, rate, period, now, cost)
  if now < L.t then now = L.t end
  if L.t ~= now then
    L.t = now
    L.changed = true
  end
  expireLog(L, now - period)
  local allowed, retry, reset = 0, 0, 0
  if cost <= rate - L.sum then
    if cost > 0 then addLog(L, now, cost) end
    allowed = 1
  elseif cost > rate then
    retry = -1
  else
    retry = passesLog(L, rate - cost) + period - now
  end
  local last = lastLog(L)
  if last then reset = last + period - now end
  return allowed, max(rate - L.sum, 0), reset, retry, 0
end

-- bucket works in units of g: its level is the Go level in hit·µs over g.
local function bucket(s, rate, period, capacity, g, now, cost, leaky)
  if s.x ~= g then
    if s.n > 0 and s.x > 0 then -- the limit changed: rescale, rounding up
      local q, r = muldiv(s.n, s.x, g)
      if r > 0 then q = q + 1 end
      s.n = q
    end
    s.x = g
  end
  local level = s.n
  if now > s.t then
    local drained = (now - s.t) * rate
    if drained >= level then level = 0 else level = level - drained end
    s.t = now
  end
  s.n = level
  local full = capacity * period
  local allowed, retry, wait = 0, 0, 0
  if cost > capacity then
    retry = -1
  elseif level + cost * period <= full then
    s.n = s.n + cost * period
    allowed = 1
    if leaky then wait = ceildiv(level, rate) end
  else
    retry = ceildiv(level + cost * period - full, rate)
  end
  local remaining = 0
  if full - s.n > 0 then remaining = (divmod(full - s.n, period)) end
  return allowed, remaining, ceildiv(s.n, rate), retry, wait
end

local function gcra(s, T, tolerance, capacity, now, cost)
  if now < s.n then now = s.n end -- a clock gone back is at the latest admission
  local tat = max(s.t, now)
  local allowed, retry = 0, 0
  if cost > capacity then
    retry = -1
  else
    local nxt = tat + cost * T
    if nxt - now <= tolerance then
      tat, s.t, s.n = nxt, nxt, now
      allowed = 1
    else
      retry = nxt - now - tolerance
    end
  end
  local remaining = 0
  if tolerance - (tat - now) > 0 then remaining = (divmod(tolerance - (tat - now), T)) end
  return allowed, remaining, tat - now, retry, 0
end

-- The batch -------------------------------------------------------------------

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end
local margin = tonumber(ARGV[2])

-- ttl returns the milliseconds a key lives, as a string: its reset time,
-- rounded up (or one more), plus the margin; at least 1. The strings are
-- kept for the call, since a number passed to redis.call costs Redis a
-- printf, and the keys of one limit decided together mostly share a TTL.
local ttls = {}
local function ttl(reset)
  local ms = (reset - reset % 1000) / 1000 + 1 + margin
  local str = ttls[ms]
  if not str then
    str = string.format('%d', ms)
    ttls[ms] = str
  end
  return str
end

-- The keys' values as the call starts, from one MGET rather than a GET per
-- request (a list reads as false), and those this call has written since:
-- cur[key] is a string state written, or false after a sliding log was.
local vals, cur = {}, {}
do
  local nk, i = #KEYS, 1
  while i <= nk do
    local j = i + 999 -- unpack's stack limit
    if j > nk then j = nk end
    local vs = redis.call('MGET', unpack(KEYS, i, j))
    for k = 1, #vs do vals[i + k - 1] = vs[k] end
    i = j + 1
  end
end

local function value(key, ki)
  local v = cur[key]
  if v == nil then return vals[ki] end
  return v
end

local function load(key, ki, alg)
  if alg == 2 then return loadLog(key) end
  return loadString(value(key, ki), alg)
end

local function save(key, alg, s)
  if alg == 2 then
    saveLog(s, ttl(s.reset))
    cur[key] = false
  else
    saveString(key, alg, s, ttl(s.reset), cur)
  end
end

local out, o = {}, 0
local scratch = { t = 0, n = 0, x = 0, orig = false, alg = 0, reset = 0 }
local blob, pos, ki = ARGV[3], 1, 1
while pos <= #blob do
  local mode, n
  mode, n, pos = sunpack('<Bi4', blob, pos)
  local states, order, all = nil, nil, true
  if mode ~= 0 then states, order = {}, {} end
  for _ = 1, n do
    local key = KEYS[ki]
    local alg, a, b, c, d, cost
    alg, a, b, c, d, cost, pos = sunpack('<Bddddd', blob, pos)

    local s
    if mode == 0 then -- the hot path, inlined: a Take
      if alg == 2 then
        s = loadLog(key)
      else
        local v = cur[key]
        if v == nil then v = vals[ki] end
        s = scratch
        s.t, s.n, s.x, s.orig, s.alg = 0, 0, 0, v, alg
        if v and #v == 25 then
          local a0, t, n0, x = sunpack('<Bddd', v)
          if a0 == alg then s.t, s.n, s.x = t, n0, x end
        end
      end
    else
      s = states[key]
      if s == nil then
        s = load(key, ki, alg)
        states[key] = s
        order[#order + 1] = key
      elseif s.alg ~= alg then -- seen earlier in the group under another algorithm
        if alg == 2 then
          s = { key = key, t = 0, sum = 0, h = 1, len = 0, app = {}, cache = {},
            merge = false, changed = true, wrong = true, alg = 2, reset = 0 }
        else
          s = { t = 0, n = 0, x = 0, alg = alg, reset = 0 }
        end
        states[key] = s
      end
    end
    ki = ki + 1

    local allowed, remaining, reset, retry, wait
    if alg == 0 then
      allowed, remaining, reset, retry, wait = fixedWindow(s, a, b, now, cost)
    elseif alg == 1 then
      allowed, remaining, reset, retry, wait = slidingWindow(s, a, b, now, cost)
    elseif alg == 2 then
      allowed, remaining, reset, retry, wait = slidingLog(s, a, b, now, cost)
    elseif alg == 3 or alg == 4 then
      allowed, remaining, reset, retry, wait = bucket(s, a, b, c, d, now, cost, alg == 4)
    else
      allowed, remaining, reset, retry, wait = gcra(s, a, b, c, now, cost)
    end
    s.reset = reset
    o = o + 1
    out[o] = spack('<Bdddd', allowed, remaining, reset, retry, wait)
    if allowed == 0 then all = false end
    if mode == 0 then
      if alg == 2 then
        saveLog(s, ttl(reset))
        cur[key] = false
      else
        local v = spack('<Bddd', alg, s.t, s.n, s.x)
        if v ~= s.orig then
          redis.call('PSETEX', key, ttl(reset), v)
          cur[key] = v
        end
      end
    end
  end
  if mode == 1 and all then
    for _, key in ipairs(order) do
      local s = states[key]
      save(key, s.alg, s)
    end
  end
end
return table.concat(out)
