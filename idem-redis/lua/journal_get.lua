-- The operation's hash, or an empty reply.
return redis.call('HGETALL', KEYS[1])
