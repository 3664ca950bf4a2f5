-- KEYS[1]: the record. ARGV: owner, retention ms, status, encoded headers, body.
-- Reply: 1 if completed, 0 if the lease was lost.
local now = server_now()
if not holds(now) then return 0 end
local exp = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'st', 'c', 'rs', ARGV[3], 'rh', ARGV[4], 'rb', ARGV[5], 'exp', exp)
redis.call('HDEL', KEYS[1], 'lease')
redis.call('PEXPIREAT', KEYS[1], exp)
return 1
