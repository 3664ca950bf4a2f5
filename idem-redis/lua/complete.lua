-- KEYS[1]: the record. ARGV: owner, retention ms, status, encoded headers, body.
-- Reply: 1 if completed (now, or already by this owner with this response:
-- a second delivery), 0 if the lease was lost.
local now = server_now()
if not holds(now) then
  local r = redis.call('HMGET', KEYS[1], 'own', 'st', 'exp', 'rs', 'rh', 'rb')
  if r[1] == ARGV[1] and r[2] == 'c' and tonumber(r[3]) > now
      and r[4] == ARGV[3] and r[5] == ARGV[4] and r[6] == ARGV[5] then
    return 1
  end
  return 0
end
local exp = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'st', 'c', 'rs', ARGV[3], 'rh', ARGV[4], 'rb', ARGV[5], 'exp', exp)
redis.call('HDEL', KEYS[1], 'lease', 'cpn', 'cpd')
redis.call('PEXPIREAT', KEYS[1], exp)
return 1
