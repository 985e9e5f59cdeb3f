-- async.lua writes back the hits a node admitted by itself in async mode
-- (store/localfirst) and reads what the node decides from next, in
-- take.lua's state ('<Bdddd' alg, t, n, x, e = the time its TTL keeps it
-- until; see take.lua).
--
-- KEYS: one key per record.
-- ARGV[1]: the records, packed little-endian, one per key:
--          a window limit '<Bdddd': alg (0 fixed_window, 1
--          sliding_window), rate, period (µs), the start of the window
--          the hits were admitted in (µs), the hits (0 only reads);
--          a bucket limit '<Bddddd': alg (3 token_bucket, 4 leaky_bucket,
--          5 gcra), take.lua's a, b, c, d of the limit (ARGV[3] there),
--          the hits (0 only reads).
-- ARGV[2]: now, in µs since the Unix epoch, or "" to read Redis's TIME.
-- ARGV[3]: the margin, milliseconds a key lives at least past its reset
--          time, as take.lua's ARGV[2].
-- ARGV[4]: "1" to merge instead (window limits only): a record's hits are
--          what its window counted at least, and a count below it is
--          raised to it, a count at or above it left alone (a node puts
--          back what Redis lost; nodes that each do never add up).
--
-- Windows: the state is first moved to the window that holds now, as a
-- Take would (a state already in a later window, on a clock ahead of this
-- one, stays there), then the hits are added to the window they were
-- admitted in: the state's current window, or, for a sliding_window, its
-- previous one; hits of an older window no longer count and are dropped.
--
-- Buckets: the hits are debited at now whether or not they fit, as
-- sluice's Limit.Debit does: the level may pass the capacity, a debt that
-- drains before the bucket admits again. Nothing is dropped; a level past
-- 2^52 (over g for token_bucket and leaky_bucket) saturates there, which
-- the Go side's bounds keep out of reach.
--
-- Returns {now, c1, c2, ...}: the script's time and, per key: for a
-- window, what the limit counts against its rate now: n for a
-- fixed_window, n plus the previous window's count weighted as sluice's
-- slidingWindow weighs it (rounded up) for a sliding_window; for a bucket,
-- its level now, debt included (sluice's Limit.Level): hit·µs over g for
-- token_bucket and leaky_bucket, µs of the theoretical arrival time ahead
-- of now for gcra. The arithmetic is prelude.lua's.

local blob = ARGV[1]
local now = clock(ARGV[2])
local marginUs = tonumber(ARGV[3]) * 1000
local merge = ARGV[4] == '1'
local out = { now }
local pos = 1

for i = 1, #KEYS do
  local alg = sunpack('<B', blob, pos)
  local rate, period, w, hits, a, b, c, d
  if alg >= 3 then
    alg, a, b, c, d, hits, pos = sunpack('<Bddddd', blob, pos)
  else
    alg, rate, period, w, hits, pos = sunpack('<Bdddd', blob, pos)
  end
  local key = KEYS[i]
  local t, n, x, e = 0, 0, 0, 0
  local a0, t0, n0, x0, e0 = decode(redis.pcall('GET', key))
  if a0 == alg then
    t, n, x, e = t0, n0, x0, e0
  end
  if alg >= 3 then
    local level, reset
    if alg == 5 then
      -- gcra: a = T; t is the theoretical arrival time, n the latest
      -- admission, at which a clock gone back is taken to be.
      local at, tat = gcraAt(t, n, now)
      if hits > 0 then
        tat = tat + hits * a
        if tat - at > TWO52 then tat = at + TWO52 end
        t, n = tat, at
      end
      level = tat - at
      reset = level
    else
      -- token_bucket, leaky_bucket: a = rate/g, b = period/g, d = g; n
      -- is the level over g, x the g it was written with (rescaled to
      -- this one, rounding up, as take.lua's step does).
      t, n, x = settle(t, n, x, a, d, now)
      if hits > 0 then
        n = n + hits * b
        if n > TWO52 then n = TWO52 end
      end
      level = n
      reset = ceildiv(n, a)
    end
    out[#out + 1] = level
    if hits > 0 then
      local life = reset + 2 * marginUs
      redis.call('PSETEX', key, math.floor(life / 1000) + 1, spack('<Bdddd', alg, t, n, x, now + life))
    end
  else
    local cur = windowStart(now, period, t)
    if t < cur then
      if alg == 1 and t == cur - period then
        x, n = n, 0
      else
        x, n = 0, 0
      end
      t = cur
    end
    if merge then
      -- hits is a count: written only where it raises one
      if w == t and hits > n then
        n = hits
      elseif alg == 1 and w == t - period and hits > x then
        x = hits
      else
        hits = 0
      end
    elseif hits > 0 then
      if w == t then
        n = n + hits
      elseif alg == 1 and w == t - period then
        x = x + hits
      end
    end
    -- what the limit counts now, at the state's window
    local elapsed = now - t
    if elapsed < 0 then elapsed = 0 end
    local c = n
    if alg == 1 and x > 0 and elapsed < period then
      -- ⌈x × left / period⌉, x × left below 2^52 (rate × period is)
      c = c + ceildiv(x * (period - elapsed), period)
    end
    out[#out + 1] = c
    if hits > 0 then
      -- lives until the state is as good as new plus the margin, at least
      local life = t + 2 * period - now + 2 * marginUs
      if alg == 0 then life = t + period - now + 2 * marginUs end
      redis.call('PSETEX', key, math.floor(life / 1000) + 1, spack('<Bdddd', alg, t, n, x, now + life))
    end
  end
end
return out
