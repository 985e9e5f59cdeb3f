-- prelude.lua begins take.lua, lease.lua and async.lua (prelude.go joins
-- them): the integer arithmetic in doubles and the reading of a string
-- state that the three share, written once. Every value is an integer
-- below 2^53, where doubles are exact; the Go side checks the bounds.
-- A script makes each of its functions at every call, used or not, so
-- this holds only what two scripts or more use (script-cost.sh counted
-- take.lua with it as before it, within the runs' spread).

local spack, sunpack = struct.pack, struct.unpack
local TWO52 = 4503599627370496

-- divmod returns q = ⌊a/b⌋ and r = a − q·b, 0 <= r < b, for integers
-- |a| <= 2^52 and 0 < b <= 2^52. Lua's a % b is a − ⌊a/b⌋·b in doubles,
-- exact but for the quotient, which may be one off near an integer: then
-- r is off by b, and correcting r makes a − r an exact multiple of b. (The
-- VM computes %; math.floor would be a C call.) Hot paths inline it.
local function divmod(a, b)
  local r = a % b
  if r < 0 then r = r + b elseif r >= b then r = r - b end
  return (a - r) / b, r
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

-- clock returns the script's now: arg, µs since the Unix epoch, or, when
-- arg is '' (the store has no clock of its own), Redis's TIME.
local function clock(arg)
  local now = tonumber(arg)
  if now then return now end
  local tm = redis.call('TIME')
  return tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end

-- windowStart mirrors sluice.windowStart: the start of the period-long
-- window that holds now, known when it is that window's.
local function windowStart(now, period, known)
  if now >= known and now - known < period then return known end
  local _, m = divmod(now, period)
  return now - m
end

-- decode returns the string state v as alg, t, n, x, e: '<Bdddd' (see
-- take.lua's State), or a 25-byte '<Bddd' written before e existed, with
-- e = 0; nil for anything else (none, a list, another size).
local function decode(v)
  if type(v) ~= 'string' then return nil end
  local size = #v
  if size == 33 then
    local alg, t, n, x, e = sunpack('<Bdddd', v)
    return alg, t, n, x, e
  elseif size == 25 then
    local alg, t, n, x = sunpack('<Bddd', v)
    return alg, t, n, x, 0
  end
  return nil
end

-- settle returns a token_bucket's or leaky_bucket's state t, n, x at now:
-- the level n, over g = x, rescaled to the limit's g = d if it differs
-- (the limit changed; rounding up), then drained at a = rate/g a µs since
-- t. It mirrors the start of sluice's bucket transitions.
local function settle(t, n, x, a, d, now)
  if x ~= d then
    if n > 0 and x > 0 then
      local q, r = muldiv(n, x, d)
      if r > 0 then q = q + 1 end
      n = q
    end
    x = d
  end
  if now > t then
    local drained = (now - t) * a
    if drained >= n then n = 0 else n = n - drained end
    t = now
  end
  return t, n, x
end

-- gcraAt returns the instant a gcra decides at and the theoretical
-- arrival time there, for a state of TAT t and latest admission n: a
-- clock gone back is taken to be at the latest admission, and a TAT in the
-- past is now.
local function gcraAt(t, n, now)
  if now < n then now = n end
  if t < now then t = now end
  return now, t
end

-- (end of prelude.lua)
