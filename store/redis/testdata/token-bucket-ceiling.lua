-- token-bucket-ceiling.lua is the second per-call ceiling that the Redis
-- store's batching is measured against: a token bucket as rate limiters
-- without batching commonly write it, one decision per call: TIME, HMGET
-- of the tokens and the time of the last refill, HSET of both, PEXPIRE.
-- It is not used by the store. Run it with bench.sh.
--
-- KEYS[1]: the bucket. ARGV[1]: tokens per second. ARGV[2]: capacity.
-- ARGV[3]: cost. Returns allowed and the tokens left.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local rate, capacity, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or capacity
local ts = tonumber(b[2]) or now
tokens = math.min(capacity, tokens + (now - ts) * rate / 1000000)
local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil((capacity - tokens) / rate * 1000) + 1000)
return { allowed, math.floor(tokens) }
