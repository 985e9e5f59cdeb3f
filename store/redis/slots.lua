-- slots.lua: the slots of one concurrency limit (sluice's `concurrency`),
-- a sorted set whose members are holders' tokens and whose scores are the
-- ends of their leases, in ms since the Unix epoch on the clock of ARGV[5].
--
-- KEYS[1]: the set
-- ARGV[1]: "a" to acquire, "r" to release
-- ARGV[2]: the holder's token
-- ARGV[3]: the limit (acquire)
-- ARGV[4]: the lease in ms (acquire)
-- ARGV[5]: now in ms, or "" to read Redis's TIME
--
-- Acquire drops the expired holders, then adds the token unless limit are
-- held, and answers {1, held} or {0, held, ms until the earliest lease
-- ends}. Release removes the token and answers how many it removed. The
-- key expires with its longest lease, so a set whose holders all died goes
-- away by itself.
local key = KEYS[1]
if ARGV[1] == 'r' then
  return redis.call('ZREM', key, ARGV[2])
end
local now = tonumber(ARGV[5])
if now == nil then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
end
local limit = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local held = redis.call('ZCARD', key)
if held >= limit then
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return {0, held, tonumber(first[2]) - now}
end
redis.call('ZADD', key, now + lease, ARGV[2])
if redis.call('PTTL', key) < lease then
  redis.call('PEXPIRE', key, lease)
end
return {1, held + 1}
