-- Leases an open operation to ARGV[1] for ARGV[2] ms from the server's now.
-- Replies {'absent', now} | {'settled', now, hash} | {'busy', now, hash}
--         | {'held', now, hash}: busy while another owner's lease lives.
local now = server_now()
local r = redis.call('HMGET', KEYS[1], 'state', 'lease_owner', 'lease_until', 'updated_at')
if not r[1] then
  return {'absent', now}
end
if settled(r[1]) then
  return {'settled', now, redis.call('HGETALL', KEYS[1])}
end
local until_ms = tonumber(r[3])
if r[2] and r[2] ~= ARGV[1] and until_ms and until_ms > now then
  return {'busy', now, redis.call('HGETALL', KEYS[1])}
end
-- Free, lapsed, or this owner's own (a second delivery): lease it.
local updated = math.max(tonumber(r[4]), now)
redis.call('HSET', KEYS[1], 'lease_owner', ARGV[1], 'lease_until', now + tonumber(ARGV[2]),
  'updated_at', updated)
redis.call('ZADD', index_of(r[1]), updated, KEYS[1])
return {'held', now, redis.call('HGETALL', KEYS[1])}
