-- Token bucket in Redis: the baseline Sluicegate's partition server is compared with.
-- KEYS[1] = bucket key; ARGV = capacity, rate (tokens/s), cost.
-- Returns {allowed (1/0), remaining whole tokens}.
-- The bucket is a hash {tokens, ts (ms)}; it expires once it would be full again.
local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local state = redis.call('HMGET', key, 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = capacity
  ts = now
end

local elapsed = now - ts
if elapsed > 0 then
  tokens = math.min(capacity, tokens + elapsed * rate / 1000)
  ts = now
end

local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end

redis.call('HSET', key, 'tokens', tokens, 'ts', ts)
local ttl = 1000
if rate > 0 then
  ttl = math.ceil((capacity - tokens) / rate * 1000) + 1000
end
redis.call('PEXPIRE', key, ttl)
return {allowed, math.floor(tokens)}
