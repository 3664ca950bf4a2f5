-- KEYS[1]: the record. ARGV: owner. Reply: 1 if deleted, 0 if the lease was lost.
if not holds(server_now()) then return 0 end
redis.call('DEL', KEYS[1])
return 1
