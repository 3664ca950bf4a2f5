-- Shared prelude of the fenced scripts: whether ARGV[1] owns the live,
-- in-flight record KEYS[1] at `now`.
local function holds(now)
  local r = redis.call('HMGET', KEYS[1], 'own', 'st', 'exp')
  return r[1] == ARGV[1] and r[2] == 'f' and r[3] and tonumber(r[3]) > now
end
