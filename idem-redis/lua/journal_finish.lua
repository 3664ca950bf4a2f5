-- Writes a finish under ARGV[1]'s live lease and releases the lease.
-- ARGV: owner, state, then a flag ('1' present, '0' absent) and a value for
-- each of the provider's id (absent keeps the stored one), the detail and
-- the search deadline (unix ms). Replies {'ok', hash} | {'lost'}.
-- Delivered twice, the second finds what the first left (released, last held
-- by the owner, the same state, detail, deadline and id) and answers with it.
local now = server_now()
local owner, state = ARGV[1], ARGV[2]
local provider_id = ARGV[3] == '1' and ARGV[4]
local detail = ARGV[5] == '1' and ARGV[6]
local search_until = ARGV[7] == '1' and ARGV[8]
local r = redis.call('HMGET', KEYS[1], 'state', 'lease_owner', 'lease_until', 'updated_at',
  'provider_id', 'detail', 'search_until')
if not r[1] then
  return {'lost'}
end
if not settled(r[1]) and held_by(r[2], r[3], owner, now) then
  local updated = math.max(tonumber(r[4]), now)
  redis.call('HSET', KEYS[1], 'state', state, 'updated_at', updated)
  if provider_id then
    redis.call('HSET', KEYS[1], 'provider_id', provider_id)
  end
  if detail then
    redis.call('HSET', KEYS[1], 'detail', detail)
  else
    redis.call('HDEL', KEYS[1], 'detail')
  end
  if search_until then
    redis.call('HSET', KEYS[1], 'search_until', search_until)
  else
    redis.call('HDEL', KEYS[1], 'search_until')
  end
  redis.call('HDEL', KEYS[1], 'lease_until')
  if r[1] ~= state then
    redis.call('ZREM', index_of(r[1]), KEYS[1])
  end
  redis.call('ZADD', index_of(state), updated, KEYS[1])
  return {'ok', redis.call('HGETALL', KEYS[1])}
end
if r[2] == owner and not r[3] and r[1] == state and r[6] == detail
    and r[7] == search_until and (not provider_id or r[5] == provider_id) then
  return {'ok', redis.call('HGETALL', KEYS[1])}
end
return {'lost'}
