-- gcra-ceiling.lua is the per-call ceiling that the Redis store's batching
-- is measured against: the smallest GCRA decision script, one decision per
-- call (TIME, GET, SET PX), as a rate limiter without batching runs it.
-- It is not used by the store. Run it with bench.sh.
--
-- KEYS[1]: the key. ARGV[1]: the emission interval T (µs). ARGV[2]: the
-- tolerance (µs). Returns allowed, remaining, reset after, retry after.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local T, tol = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local nxt = tat + T
if nxt - now <= tol then
  redis.call('SET', KEYS[1], string.format('%d', nxt), 'PX', math.ceil((nxt - now) / 1000) + 1)
  return {1, math.floor((tol - (nxt - now)) / T), nxt - now, 0}
end
return {0, 0, tat - now, nxt - now - tol}
