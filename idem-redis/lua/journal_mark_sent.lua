-- Counts one send after ARGV[2] under ARGV[1]'s live lease, leaving ARGV[3]
-- sends (ARGV[2] + 1, saturated by the caller); the first send starts the
-- provider's key window. Replies {'ok', hash} | {'lost'}.
-- Delivered twice, the second finds ARGV[3] sends under the lease and
-- answers as the first did, writing nothing.
local now = server_now()
local r = redis.call('HMGET', KEYS[1], 'state', 'lease_owner', 'lease_until', 'sends',
  'updated_at', 'first_sent_at')
if not r[1] or settled(r[1]) or not held_by(r[2], r[3], ARGV[1], now) then
  return {'lost'}
end
local sends = tonumber(r[4])
local after = tonumber(ARGV[3])
if sends == tonumber(ARGV[2]) then
  local updated = math.max(tonumber(r[5]), now)
  redis.call('HSET', KEYS[1], 'sends', ARGV[3], 'updated_at', updated)
  if not r[6] then
    redis.call('HSET', KEYS[1], 'first_sent_at', now)
  end
  redis.call('ZADD', index_of(r[1]), updated, KEYS[1])
  sends = after
end
if sends ~= after then
  return {'lost'}
end
return {'ok', redis.call('HGETALL', KEYS[1])}
