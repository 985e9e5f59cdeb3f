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
-- ARGV[2]: the margin, milliseconds a key lives at least past its reset
--          time (see TTL).
-- ARGV[3]: the requests, packed (little-endian; one string, so that Redis
--          parses one argument, not six per request). Groups, each a header
--          '<Bi4' (mode, n) and requests '<Bddddd' (alg, a, b, c, d, cost):
--   alg 0 fixed_window, 1 sliding_window, 2 sliding_log: a = rate, b = period
--   alg 3 token_bucket, 4 leaky_bucket: a = rate/g, b = period/g,
--       c = capacity, d = g = gcd(rate, period)
--   alg 5 gcra: a = T (emission interval), b = tolerance, c = capacity
--   alg 16 sliding_window of c > 1 sub-windows (precision): a = rate,
--       b = period, c = sub-windows, a divisor of b (the 1-sub-window
--       sliding_window is alg 1)
-- mode 0: one request for the group's n keys (Takes of one limit and
--         cost), each applied and written at once.
-- mode 1: n requests, decided in order on working copies (a key given
--         twice sees the first request's hits) and written only if all
--         are allowed (TakeAll).
-- mode 2: decided as mode 1 and never written (a dry run).
-- ARGV[4]: '1' when a key occurs more than once in KEYS, so that a request
--          must see what an earlier one of the call wrote; otherwise every
--          state read is the MGET's.
--
-- Returns one string: now ('<d', µs), the allowed bits, then a 33-byte
-- record per request. A Take (mode 0) of a string state (every algorithm
-- but sliding_log) returns the state it found, '<Bdddd' as stored (a
-- 25-byte one with e = 0; 33 zero bytes for none), from which Go replays
-- the transition at now: the decision is Go's, with no record to pack
-- here. Every other request returns its decision '<Bdddd': allowed (1 or
-- 0), remaining, reset after (µs), retry after (µs, -1 for never), wait
-- (µs, leaky_bucket); a TakeAll's (mode 1 or 2) then a second record, the
-- string state its key had when the group began, as a Take's (33 zero
-- bytes for a sliding_log, a key met earlier in the group, or none), on
-- which Go replays the group to check the decisions (about 4% more per
-- TakeAll request: script-cost.sh's call made one TakeAll of 25, 35,515-
-- 37,391 instructions per request without it, 37,877-38,203 with it,
-- 2-3 runs each). The allowed bits, in
-- a '<d' per 52, from the lowest bit, say whether each found state's Take
-- was allowed, so that Go checks that its replay agrees.
--
-- State: fixed_window, sliding_window, token_bucket, leaky_bucket and gcra
-- keep a 33-byte string, struct '<Bdddd': algorithm, t, n, x (the previous
-- window's count, or the bucket's g), and e, the time (µs, on the
-- script's clock) until which the key's TTL is known to keep it (a
-- 25-byte string without e, as written before e existed, reads as e = 0).
-- A sliding_window of sub-windows (alg 16) keeps a string '<BBd' (16,
-- sub-windows N, the current sub-window's start) and then N + 1 counts
-- '<d', the current sub-window's first and the weighted oldest last: 8N +
-- 18 bytes; it returns its decision, as a sliding_log does, and its TTL is
-- set with PSETEX at each write.
-- sliding_log keeps a list: a header '<Bdd' (algorithm, latest time, sum)
-- and then one '<dd' (time, hits) per admitted request, oldest first. A key
-- found under another algorithm (or of another type) starts afresh.
--
-- TTL: a key must live at least until its reset time plus ARGV[2] (the
-- margin), so that Redis forgets keys once they are as good as new, but
-- never sooner. A write whose key already lives that long (now + reset +
-- margin <= e) keeps the TTL; otherwise PSETEX sets it to reset + 2 ×
-- margin, so that a busy key sets its TTL about once per margin rather
-- than at every write: a SET with a TTL removes and adds the key's expiry
-- and rewrites the command for replicas, about 3,000 instructions of Redis
-- more than one that keeps it. A write that keeps the TTL is SETRANGE key 0
-- with the 33 bytes, over a 33-byte state of the same algorithm (the only
-- one whose e is known): the same bytes and TTL as SET KEEPTTL, but Redis
-- overwrites the string in place and answers a number where SET's status
-- becomes a table in Lua (a table to collect) and its option a string to
-- compare: script-cost.sh counted 20,948 instructions per decision with SET
-- KEEPTTL, 18,875 with SETRANGE (one run each; 10%). Sliding logs set
-- theirs with PEXPIRE at each write.
--
-- Cost (measure with testdata/script-cost.sh): a call reads all string
-- states with one MGET rather than a GET per request, then makes one write
-- per request that changes its key. A call costs Redis about 68,000
-- instructions whatever it carries (the script's start, its closures, the
-- garbage collector, TIME, the reply) and each decision about 16,000 more
-- (n=1: 86,000 a call; n=25: 18,900 a decision).

local max = math.max

-- The arithmetic (divmod, ceildiv, muldiv, windowStart), clock, decode,
-- settle and gcraAt are prelude.lua's.

-- Sliding logs ---------------------------------------------------------------

-- makeLogs makes the sliding log's functions, which a call makes only when
-- it has a sliding_log request (see step on the cost of a function).
local function makeLogs()
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

  return { load = loadLog, save = saveLog, take = slidingLog }
end
local logs -- makeLogs's table, once made

-- Sliding windows of sub-windows ----------------------------------------------

-- makeWindows makes windows, sluice's slidingWindow of subs > 1 sub-windows
-- (alg 16), which a call makes only when it has such a request. windows
-- decides cost hits at now on v, the key's value (a state of another
-- algorithm or precision starts afresh), for a = rate, b = period and c =
-- subs, and returns the new state to write (nil when nothing was taken)
-- and the decision: allowed, remaining, reset, retry (-1: never). Its
-- counts are c[1] (the current sub-window) to c[subs + 1] (the oldest,
-- weighted), where sluice's State keeps n, the log and p.
local function makeWindows()
  return function(v, rate, period, subs, now, cost)
    local g = period / subs -- exact: Go checks that subs divides period
    local c, t = nil, 0
    if type(v) == 'string' and #v == 8 * subs + 18 then
      local a0, n0, t0 = sunpack('<BBd', v)
      if a0 == 16 and n0 == subs then
        c = { sunpack('<' .. string.rep('d', subs + 1), v, 11) }
        t = t0
      end
    end
    if not c then
      c = {}
      for i = 1, subs + 1 do c[i] = 0 end
    end
    local ws = windowStart(now, g, t)
    if ws < t then ws, now = t, t end
    local slid = ws ~= t
    if slid then -- slide on k sub-windows
      local k, r = divmod(ws - t, g)
      if r ~= 0 or k > subs then k = subs + 1 end
      for i = subs + 1, 1, -1 do
        if i > k then c[i] = c[i - k] else c[i] = 0 end
      end
    end
    local elapsed = now - ws
    local full = 0
    for i = 1, subs do full = full + c[i] end
    local weighed, left, x = 0, g - elapsed, c[subs + 1]
    if x > 0 and left > 0 then
      local q, r = muldiv(x, left, g)
      if r ~= 0 then q = q + 1 end
      weighed = q
    end
    local free = rate - full - weighed
    local allowed, reset, retry = 0, 0, 0
    if cost <= free then
      c[1] = c[1] + cost
      free = free - cost
      allowed = 1
    elseif cost > rate then
      retry = -1
    else
      -- k sub-windows on, c[1..subs-k] count in full and c[subs+1-k]
      -- weighs (slidingRetry in Go)
      for k = 0, subs do
        local room = rate - cost - full
        if room >= 0 then
          local n, l = c[subs + 1 - k], g
          if n > room then l = (muldiv(room, g, n)) end
          retry = (k + 1) * g - l - elapsed
          break
        end
        full = full - c[subs - k]
      end
    end
    for j = 1, subs + 1 do -- the newest count stops weighing subs + 1 sub-windows after it began
      if c[j] > 0 then
        reset = ws + (subs + 2 - j) * g - now
        break
      end
    end
    if free < 0 then free = 0 end
    local nv
    if slid or allowed == 1 and cost > 0 then
      nv = spack('<BBd' .. string.rep('d', subs + 1), 16, subs, ws, unpack(c, 1, subs + 1))
    end
    return nv, allowed, free, reset, retry
  end
end
local windows -- makeWindows's function, once made

-- The algorithms whose state is a string, in one function (every function
-- a script defines is made afresh at each call, for about 1,000 Redis
-- instructions each): step applies algorithm alg to the state t, n, x with
-- the request's a, b, c, d (see ARGV[3]), now and cost, and returns the new
-- t, n, x and the decision: allowed, remaining, reset after, retry after
-- (-1: never), wait. Each part mirrors its Go transition line by line, on
-- locals rather than tables, since a table field costs the Lua VM a lookup
-- and this is the hot path.
local function step(alg, t, n, x, a, b, c, d, now, cost)
  local allowed, remaining, reset, retry, wait = 0, 0, 0, 0, 0
  if alg == 5 then
    -- gcra: a = T, b = tolerance, c = capacity; t is the theoretical
    -- arrival time and n the time of the latest admission.
    local tat
    now, tat = gcraAt(t, n, now)
    if cost > c then
      retry = -1
    else
      local nxt = tat + cost * a
      if nxt - now <= b then
        tat, t, n = nxt, nxt, now
        allowed = 1
      else
        retry = nxt - now - b
      end
    end
    local left = b - (tat - now)
    if left > 0 then -- remaining = ⌊left/a⌋, divmod inlined
      local r = left % a
      if r < 0 then r = r + a elseif r >= a then r = r - a end
      remaining = (left - r) / a
    end
    reset = tat - now
  elseif alg == 3 or alg == 4 then
    -- token_bucket, leaky_bucket: a = rate/g, b = period/g, c = capacity,
    -- d = g. The level n is the Go level in hit·µs over g, and x is g.
    t, n, x = settle(t, n, x, a, d, now)
    local level = n
    local full = c * b
    if cost > c then
      retry = -1
    elseif level + cost * b <= full then
      n = n + cost * b
      allowed = 1
      if alg == 4 then wait = ceildiv(level, a) end
    else
      retry = ceildiv(level + cost * b - full, a)
    end
    local left = full - n
    if left > 0 then -- remaining = ⌊left/b⌋, divmod inlined
      local r = left % b
      if r < 0 then r = r + b elseif r >= b then r = r - b end
      remaining = (left - r) / b
    end
    reset = ceildiv(n, a)
  elseif alg == 0 then
    -- fixed_window: a = rate, b = period.
    local ws = windowStart(now, b, t)
    if ws < t then ws = t end
    if ws ~= t then t, n = ws, 0 end
    local stop = ws + b
    if cost <= a - n then
      n = n + cost
      allowed = 1
    elseif cost > a then
      retry = -1
    else
      retry = stop - now
    end
    if n > 0 then reset = stop - now end
    remaining = a - n
    if remaining < 0 then remaining = 0 end
  else
    -- sliding_window: a = rate, b = period; x is the previous window's
    -- count, weighed by the part of it still in the window, rounded up.
    local ws = windowStart(now, b, t)
    if ws < t then ws, now = t, t end
    if ws == t then
    elseif ws == t + b then
      t, x, n = ws, n, 0
    else
      t, x, n = ws, 0, 0
    end
    local elapsed = now - ws
    local weighed, left = 0, b - elapsed
    if x > 0 and left > 0 then
      local q, r = muldiv(x, left, b)
      if r ~= 0 then q = q + 1 end
      weighed = q
    end
    local free = a - n - weighed
    if cost <= free then
      n = n + cost
      free = free - cost
      allowed = 1
    elseif cost > a then
      retry = -1
    else
      -- the time left of a window of count hits, past which at most k
      -- of them still weigh (leftFor in Go)
      local k = a - n - cost
      if k >= 0 then
        local l = b
        if x > k then l = (muldiv(k, b, x)) end
        retry = b - l - elapsed
      else
        local l = b
        if n > a - cost then l = (muldiv(a - cost, b, n)) end
        retry = 2 * b - l - elapsed
      end
    end
    if n > 0 then
      reset = ws + 2 * b - now
    elseif x > 0 then
      reset = ws + b - now
    end
    if free < 0 then free = 0 end
    remaining = free
  end
  return t, n, x, allowed, remaining, reset, retry, wait
end

-- The batch -------------------------------------------------------------------

local now = clock(ARGV[1])
local marginUs = tonumber(ARGV[2]) * 1000

-- ttl returns the milliseconds of a TTL of life µs, rounded up (or one
-- more), as a string, the last one kept: a number passed to redis.call
-- costs Redis a printf, and the keys of one limit decided together mostly
-- share a TTL. (A table by ms cost the same, 20,869 instructions per
-- decision against 20,866 in one run of script-cost.sh each, well within
-- its spread, but made the in-process VM of the tests, gopher-lua, grow
-- an array as long as the largest ms below 2^26.)
local lastMs, lastTTL
local function ttl(life)
  local ms = (life - life % 1000) / 1000 + 1
  if ms ~= lastMs then
    lastMs, lastTTL = ms, string.format('%d', ms)
  end
  return lastTTL
end

-- The keys' values as the call starts, from one MGET rather than a GET per
-- request (a list reads as false), and, when keys repeat (ARGV[4]), those
-- this call has written since: cur[key] is a string state written, or
-- false after a sliding log was.
local vals, cur = {}, {}
local repeats = ARGV[4] == '1'
do
  local nk = #KEYS
  if nk > 0 and nk <= 1000 then
    vals = redis.call('MGET', unpack(KEYS))
  else -- in parts: unpack's stack holds about 8,000 values
    for i = 1, nk, 1000 do
      local vs = redis.call('MGET', unpack(KEYS, i, math.min(i + 999, nk)))
      for k = 1, #vs do vals[i + k - 1] = vs[k] end
    end
  end
end

local out, o = { '' }, 1 -- now and the allowed bits (at the end), then the records
local bits, bit, words = 0, 1, nil -- the allowed bits, and the words filled
local EMPTY -- no state found: 33 zero bytes, once needed
local LASTBIT = 2251799813685248 -- 2^51, the last of a word's 52

-- makeTakeAll makes the function that decides a TakeAll's group (mode 1)
-- or its dry run (2): decided in order on working copies, a key given twice
-- seeing the first request's hits, and written only if all are allowed
-- (1). Made only when a call has such a group (see step on the cost of a
-- function); Takes, the hot path, load and write their states inline in
-- the loop below, the same way as state and write here.
local function makeTakeAll()
  -- state returns the string state of key, the ki-th key, under alg: t,
  -- n, x, the stored string (false for none), which a write compares
  -- with, e, and the record that returns the state to Go (nil for none).
  local function state(key, ki, alg)
    local v = cur[key]
    if v == nil then v = vals[ki] end
    local a0, t, n, x, e = decode(v)
    if a0 ~= alg then return 0, 0, 0, v, 0, nil end
    if e == 0 and #v == 25 then return t, n, x, v, 0, spack('<Bdddd', alg, t, n, x, 0) end
    return t, n, x, v, e, v
  end

  -- write stores a string state if it changed; see TTL above.
  local function write(key, alg, t, n, x, orig, e, reset)
    local v
    if now + reset + marginUs <= e then
      v = spack('<Bdddd', alg, t, n, x, e)
      if v == orig then return end
      redis.call('SETRANGE', key, '0', v)
    else
      local life = reset + 2 * marginUs
      v = spack('<Bdddd', alg, t, n, x, now + life)
      redis.call('PSETEX', key, ttl(life), v)
    end
    cur[key] = v
  end

  -- takeAll decides the group of n requests at pos in the blob, whose
  -- first key is KEYS[ki], appends the decisions to out and returns the
  -- new pos, ki and o.
  return function(mode, n, blob, pos, ki, o)
    local states, order, all = {}, {}, true
    for _ = 1, n do
      local key = KEYS[ki]
      local alg, a, b, c, d, cost
      alg, a, b, c, d, cost, pos = sunpack('<Bddddd', blob, pos)
      local s, rec = states[key], nil
      if s ~= nil and s.alg ~= alg then -- seen earlier in the group under another algorithm
        if alg == 2 then
          s = { key = key, t = 0, sum = 0, h = 1, len = 0, app = {}, cache = {},
            merge = false, changed = true, wrong = true, alg = 2, reset = 0 }
        elseif alg == 16 then
          s = { alg = 16, v = false, reset = 0 }
        else
          s = { t = 0, n = 0, x = 0, alg = alg, reset = 0, orig = false, e = 0 }
        end
        states[key] = s
      elseif s == nil then
        if alg == 2 then
          logs = logs or makeLogs()
          s = logs.load(key)
        elseif alg == 16 then
          local v = cur[key]
          if v == nil then v = vals[ki] end
          s = { alg = 16, v = v, reset = 0 }
        else
          local t, m, x, orig, e
          t, m, x, orig, e, rec = state(key, ki, alg)
          s = { t = t, n = m, x = x, alg = alg, reset = 0, orig = orig, e = e }
        end
        states[key] = s
        order[#order + 1] = key
      end
      local allowed, remaining, reset, retry, wait
      if alg == 2 then
        logs = logs or makeLogs() -- s may be a fresh log, not loaded
        allowed, remaining, reset, retry, wait = logs.take(s, a, b, now, cost)
      elseif alg == 16 then
        windows = windows or makeWindows()
        local nv
        nv, allowed, remaining, reset, retry = windows(s.nv or s.v, a, b, c, now, cost)
        wait = 0
        if nv then s.nv = nv end
      else
        s.t, s.n, s.x, allowed, remaining, reset, retry, wait =
          step(alg, s.t, s.n, s.x, a, b, c, d, now, cost)
      end
      s.reset = reset
      if not rec then
        EMPTY = EMPTY or string.rep('\0', 33)
        rec = EMPTY
      end
      out[o + 1] = spack('<Bdddd', allowed, remaining, reset, retry, wait)
      out[o + 2] = rec
      o = o + 2
      if allowed == 0 then all = false end
      ki = ki + 1
    end
    if mode == 1 and all then
      for _, key in ipairs(order) do
        local s = states[key]
        if s.alg == 2 then
          logs.save(s, ttl(s.reset + marginUs))
          cur[key] = false
        elseif s.alg == 16 then
          if s.nv then
            redis.call('PSETEX', key, ttl(s.reset + marginUs), s.nv)
            cur[key] = s.nv
          end
        else
          write(key, s.alg, s.t, s.n, s.x, s.orig, s.e, s.reset)
        end
      end
    end
    return pos, ki, o
  end
end
local takeAll -- makeTakeAll's function, once made

local blob, pos, ki = ARGV[3], 1, 1
while pos <= #blob do
  local mode, n
  mode, n, pos = sunpack('<Bi4', blob, pos)
  if mode == 0 then -- Takes of one request: each decided and written at once
    local alg, a, b, c, d, cost
    alg, a, b, c, d, cost, pos = sunpack('<Bddddd', blob, pos)
    for _ = 1, n do
      local key = KEYS[ki]
      if alg == 2 then
        logs = logs or makeLogs()
        local L = logs.load(key)
        local allowed, remaining, reset, retry, wait = logs.take(L, a, b, now, cost)
        logs.save(L, ttl(reset + marginUs))
        if repeats then cur[key] = false end
        o = o + 1
        out[o] = spack('<Bdddd', allowed, remaining, reset, retry, wait)
      elseif alg == 16 then
        windows = windows or makeWindows()
        local v
        if repeats then v = cur[key] end
        if v == nil then v = vals[ki] end
        local nv, allowed, remaining, reset, retry = windows(v, a, b, c, now, cost)
        if nv then
          redis.call('PSETEX', key, ttl(reset + marginUs), nv)
          if repeats then cur[key] = nv end
        end
        o = o + 1
        out[o] = spack('<Bdddd', allowed, remaining, reset, retry, 0)
      else
        -- the state, as makeTakeAll's state reads it, and the record
        -- that returns it
        local t, m, x, e = 0, 0, 0, 0
        local v
        if repeats then v = cur[key] end
        if v == nil then v = vals[ki] end
        local rec
        if v then
          local size = #v
          if size == 33 then
            rec = v
            local a0, t0, m0, x0, e0 = sunpack('<Bdddd', v)
            if a0 == alg then t, m, x, e = t0, m0, x0, e0 end
          elseif size == 25 then
            local a0, t0, m0, x0 = sunpack('<Bddd', v)
            if a0 == alg then
              t, m, x = t0, m0, x0
              rec = spack('<Bdddd', alg, t, m, x, 0)
            end
          end
        end
        local allowed, reset
        if alg == 5 then
          -- gcra, as in step, inlined, and only what the write needs:
          -- Go replays the rest. A third copy of the algorithm (with
          -- step and gcra.go), kept because it pays: script-cost.sh
          -- counts 20,532-20,808 instructions per decision with it and
          -- 22,839-23,578 with step's instead (three runs each), 11%
          -- less. The in-process tests (twin_test.go) check both copies.
          local at = now
          if at < m then at = m end
          local tat = t
          if tat < at then tat = at end
          allowed = 0
          if cost <= c then
            local nxt = tat + cost * a
            if nxt - at <= b then
              tat, t, m = nxt, nxt, at
              allowed = 1
            end
          end
          reset = tat - at
        else
          local _
          t, m, x, allowed, _, reset = step(alg, t, m, x, a, b, c, d, now, cost)
        end
        -- the write, as makeTakeAll's write does it
        if now + reset + marginUs <= e then
          local nv = spack('<Bdddd', alg, t, m, x, e)
          if nv ~= v then
            redis.call('SETRANGE', key, '0', nv)
            if repeats then cur[key] = nv end
          end
        else
          local life = reset + 2 * marginUs
          local nv = spack('<Bdddd', alg, t, m, x, now + life)
          redis.call('PSETEX', key, ttl(life), nv)
          if repeats then cur[key] = nv end
        end
        if not rec then
          EMPTY = EMPTY or string.rep('\0', 33)
          rec = EMPTY
        end
        o = o + 1
        out[o] = rec
        if allowed == 1 then bits = bits + bit end
        if bit == LASTBIT then
          words = words or {}
          words[#words + 1] = bits
          bits, bit = 0, 1
        else
          bit = bit * 2
        end
      end
      ki = ki + 1
    end
  else
    takeAll = takeAll or makeTakeAll()
    pos, ki, o = takeAll(mode, n, blob, pos, ki, o)
  end
end
if words then
  if bit > 1 then words[#words + 1] = bits end
  out[1] = spack('<d' .. string.rep('d', #words), now, unpack(words))
elseif bit > 1 then
  out[1] = spack('<dd', now, bits)
else
  out[1] = spack('<d', now)
end
return table.concat(out)
