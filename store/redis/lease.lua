-- lease.lua gives back the unused hits of leases (store/localfirst's lease
-- mode): a lease is a Take of several hits that a node then admits by
-- itself, and what it did not admit when the lease ends comes back here.
-- Only window counts come back: fixed_window and sliding_window, whose
-- states (see take.lua: '<Bdddd' alg, t = window start, n = its count,
-- x = the previous window's count (sliding_window), e) add up hits, so
-- removing a lease's unused hits is exactly as if they were never taken.
--
-- KEYS: one key per return.
-- ARGV[1]: the returns, packed '<Bddd' per key, little-endian: alg (0
--          fixed_window, 1 sliding_window), the start of the window the
--          lease was taken in (µs), the period (µs), the hits to give back.
-- ARGV[2]: now, in µs since the Unix epoch, or "" to read Redis's TIME.
--
-- A return whose window has passed gives nothing back: those hits no
-- longer count (a sliding_window's previous window still weighs, so a
-- return one window late takes them from x; two windows late, nothing). A key under another
-- algorithm, or gone, is left alone. Never below zero: a count holds at
-- least the unused hits of every lease taken from it.
--
-- Returns the number of hits given back.

local sunpack, spack = struct.unpack, struct.pack
local blob = ARGV[1]
local now = tonumber(ARGV[2])
if not now then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end
local pos, given = 1, 0
for i = 1, #KEYS do
  local alg, ws, period, hits
  alg, ws, period, hits, pos = sunpack('<Bddd', blob, pos)
  local key = KEYS[i]
  local v = redis.pcall('GET', key)
  if type(v) == 'string' and (#v == 33 or #v == 25) then
    local a0, t, n, x, e
    if #v == 33 then
      a0, t, n, x, e = sunpack('<Bdddd', v)
    else
      a0, t, n, x = sunpack('<Bddd', v)
      e = 0
    end
    if a0 == alg then
      -- cur is the window that holds now
      local cur = now - now % period
      local back = 0
      if t == ws and (cur == ws or (alg == 1 and cur == ws + period)) then
        back = math.min(hits, n) -- the lease's window is the state's current one
        n = n - back
      elseif alg == 1 and t == ws + period and cur == t then
        back = math.min(hits, x) -- it is the state's previous one
        x = x - back
      end
      if back > 0 then
        redis.call('SET', key, spack('<Bdddd', a0, t, n, x, e), 'KEEPTTL')
        given = given + back
      end
    end
  end
end
return given
