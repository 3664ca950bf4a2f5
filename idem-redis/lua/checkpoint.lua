-- KEYS[1]: the record. ARGV: owner, name, JSON data. Reply: 1, or 0 if the lease was lost.
if not holds(server_now()) then return 0 end
redis.call('HSET', KEYS[1], 'cpn', ARGV[2], 'cpd', ARGV[3])
return 1
