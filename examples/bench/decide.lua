-- wrk script: POST /v1/decide for one of 10,000 users at random.
--   wrk -t2 -c50 -d10s --latency -s examples/bench/decide.lua http://127.0.0.1:8080
-- USERS in the environment changes the number of users.
local users = tonumber(os.getenv("USERS") or "10000")
local bodies = {}
for i = 1, users do
  bodies[i] = string.format(
    '{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"user-%d"}]}]}', i - 1)
end

wrk.method = "POST"
wrk.path = "/v1/decide"
wrk.headers["Content-Type"] = "application/json"

request = function()
  return wrk.format(nil, nil, nil, bodies[math.random(users)])
end
