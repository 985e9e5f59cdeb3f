-- async.lua writes back the hits a node admitted by itself in async mode
-- (store/localfirst) and reads the counts the node decides from next.
-- Window counts only: fixed_window and sliding_window, in take.lua's
-- state ('<Bdddd' alg, t = window start, n = its count, x = the previous
-- window's count (sliding_window), e = the time its TTL keeps it until).
--
-- KEYS: one key per record.
-- ARGV[1]: the records, packed '<Bdddd' per key, little-endian: alg (0
--          fixed_window, 1 sliding_window), rate, period (µs), the start
--          of the window the hits were admitted in (µs), the hits (0 only
--          reads).
-- ARGV[2]: now, in µs since the Unix epoch, or "" to read Redis's TIME.
-- ARGV[3]: the margin, milliseconds a key lives at least past its reset
--          time, as take.lua's ARGV[2].
--
-- The state is first moved to the window that holds now, as a Take would
-- (a state already in a later window, on a clock ahead of this one, stays
-- there), then the hits are added to the window they were admitted in:
-- the state's current window, or, for a sliding_window, its previous one;
-- hits of an older window no longer count and are dropped.
--
-- Returns {now, c1, c2, ...}: the script's time and, per key, what the
-- limit counts against its rate now: n for a fixed_window, n plus the
-- previous window's count weighted as sluice's slidingWindow weighs it
-- (rounded up) for a sliding_window.

local sunpack, spack = struct.unpack, struct.pack
local blob = ARGV[1]
local now = tonumber(ARGV[2])
if not now then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end
local marginUs = tonumber(ARGV[3]) * 1000
local out = { now }
local pos = 1
for i = 1, #KEYS do
  local alg, rate, period, w, hits
  alg, rate, period, w, hits, pos = sunpack('<Bdddd', blob, pos)
  local key = KEYS[i]
  local v = redis.pcall('GET', key)
  local t, n, x, e = 0, 0, 0, 0
  if type(v) == 'string' and (#v == 33 or #v == 25) then
    local a0, t0, n0, x0, e0
    if #v == 33 then
      a0, t0, n0, x0, e0 = sunpack('<Bdddd', v)
    else
      a0, t0, n0, x0 = sunpack('<Bddd', v)
      e0 = 0
    end
    if a0 == alg then
      t, n, x, e = t0, n0, x0, e0
    end
  end
  local cur = now - now % period
  if t < cur then
    if alg == 1 and t == cur - period then
      x, n = n, 0
    else
      x, n = 0, 0
    end
    t = cur
  end
  if hits > 0 then
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
    local left = period - elapsed
    local q = x * left
    local r = q % period
    c = c + (q - r) / period
    if r > 0 then c = c + 1 end
  end
  out[#out + 1] = c
  if hits > 0 then
    -- lives until the state is as good as new plus the margin, at least
    local life = t + 2 * period - now + 2 * marginUs
    if alg == 0 then life = t + period - now + 2 * marginUs end
    redis.call('PSETEX', key, math.floor(life / 1000) + 1, spack('<Bdddd', alg, t, n, x, now + life))
  end
end
return out
