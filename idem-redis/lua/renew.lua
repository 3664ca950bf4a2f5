-- KEYS[1]: the record. ARGV: owner, extend ms.
-- Reply: the new lease expiry in ms, or 0 if the lease was lost.
local now = server_now()
if not holds(now) then return 0 end
local lease = now + tonumber(ARGV[2])
local exp = math.max(tonumber(redis.call('HGET', KEYS[1], 'exp')), lease)
redis.call('HSET', KEYS[1], 'lease', lease, 'exp', exp)
redis.call('PEXPIREAT', KEYS[1], exp)
return lease
