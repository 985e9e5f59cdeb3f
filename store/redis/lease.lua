-- lease.lua gives back the unused hits of leases (store/localfirst's lease
-- mode): a lease is a Take of several hits that a node then admits by
-- itself, and what it did not admit when the lease ends comes back here.
-- States are take.lua's ('<Bdddd': alg, t, n, x, e); the arithmetic is
-- prelude.lua's.
--
-- KEYS: one key per return.
-- ARGV[1]: the returns, packed '<Bddddddd' per key, little-endian: the
--          limit as take.lua reads it (alg, a, b, c, d), the key's state t
--          and n as the lease's grant left them (n over g for
--          token_bucket and leaky_bucket, as stored), the hits to give
--          back.
-- ARGV[2]: now, in µs since the Unix epoch, or "" to read Redis's TIME.
--
-- fixed_window, sliding_window (a = rate, b = period; t is the start of
-- the window the lease was taken in): counts add up, so removing a lease's
-- unused hits is exactly as if they were never taken. A return whose
-- window has passed gives nothing back: those hits no longer count (a
-- sliding_window's previous window still weighs, so a return one window
-- late takes them from x; two windows late, nothing). Never below zero: a
-- count holds at least the unused hits of every lease taken from it.
--
-- gcra (a = T), token_bucket and leaky_bucket (a = rate/g, b = period/g,
-- d = g): the grant gave the lease the last slots of the key's theoretical
-- arrival time (TAT), and a node admits a leased hit only by the start of
-- its slot (sluice.Limit.LeaseTake). Its unused slots come back, exactly,
-- only while they are still the last: while the TAT is the one the grant
-- left (nothing admitted since; a denial moves no TAT). Then the TAT goes
-- back by the unused slots, to now at the earliest (slots already past
-- have drained as any hit's do), and the key is as if the lease had been
-- its used hits only. The count returned is of whole slots given back. Once anything else was admitted, its slots lie after
-- the lease's and a later lease's hits may be due in them: giving back
-- would let the store admit into time that a hit still to come is
-- counted in, so nothing is given back (those hits drain at the rate, as
-- admitted hits do).
--
-- A key under another algorithm or limit, or gone, is left alone.
--
-- Returns the number of hits given back.

local blob = ARGV[1]
local now = clock(ARGV[2])

local pos, given = 1, 0
for i = 1, #KEYS do
  local alg, a, b, c, d, t0, n0, hits
  alg, a, b, c, d, t0, n0, hits, pos = sunpack('<Bddddddd', blob, pos)
  local key = KEYS[i]
  local a0, t, n, x, e = decode(redis.pcall('GET', key))
  if a0 then
    local back, changed = 0, false
    if a0 ~= alg then
    elseif alg == 0 or alg == 1 then
      local period = b
      -- cur is the window that holds now
      local cur = windowStart(now, period, t)
      if t == t0 and (cur == t0 or (alg == 1 and cur == t0 + period)) then
        back = math.min(hits, n) -- the lease's window is the state's current one
        n, changed = n - back, back > 0
      elseif alg == 1 and t == t0 + period and cur == t then
        back = math.min(hits, x) -- it is the state's previous one
        x, changed = x - back, back > 0
      end
    elseif alg == 5 then
      -- gcra: t is the TAT
      if t == t0 and t > now then
        local keep = math.max(t - hits * a, now)
        back, changed = divmod(t - keep, a), true
        t = keep
      end
    elseif (alg == 3 or alg == 4) and x == d then
      -- token_bucket, leaky_bucket: the level n at t; the TAT is
      -- t + n/a, the grant's t0 + n0/a: the same while the level drained
      -- since is (t − t0)·a exactly
      if t >= t0 and n0 - n == (t - t0) * a then
        t, n = settle(t, n, x, a, d, now)
        local take = math.min(hits * b, n)
        back, changed = divmod(take, b), take > 0
        n = n - take
      end
    end
    if changed then
      redis.call('SET', key, spack('<Bdddd', a0, t, n, x, e), 'KEEPTTL')
      given = given + back
    end
  end
end
return given
