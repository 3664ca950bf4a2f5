-- KEYS[1]: the record. ARGV: owner. Reply: 1 if released, or if nobody holds
-- the record (released already: a second delivery); 0 if the lease was lost.
local now = server_now()
if not holds(now) then
  local exp = tonumber(redis.call('HGET', KEYS[1], 'exp'))
  if not exp or exp <= now then return 1 end
  return 0
end
redis.call('DEL', KEYS[1])
return 1
