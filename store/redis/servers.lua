-- servers.lua: the servers sharing one Redis in async mode
-- (store/localfirst), a sorted set whose members are servers' IDs and
-- whose scores are the ends of their heartbeats, in ms since the Unix
-- epoch on the clock of ARGV[3].
--
-- KEYS[1]: the set
-- ARGV[1]: the server's ID
-- ARGV[2]: how long its heartbeat lasts, in ms; 0 removes the server
-- ARGV[3]: now in ms, or "" to read Redis's TIME
--
-- Drops the servers whose heartbeat ended, renews (or removes) this one,
-- and answers how many servers are left. The key expires with its longest
-- heartbeat, so a set whose servers all stopped goes away by itself.
local key = KEYS[1]
local now = tonumber(ARGV[3])
if now == nil then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
end
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if ttl > 0 then
  redis.call('ZADD', key, now + ttl, ARGV[1])
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
else
  redis.call('ZREM', key, ARGV[1])
end
return redis.call('ZCARD', key)
