-- Records an operation unless its key exists; replies the stored hash.
-- ARGV: namespace, subject, effect, request (JSON text), provider key.
if redis.call('EXISTS', KEYS[1]) == 0 then
  local now = server_now()
  redis.call('HSET', KEYS[1], 'namespace', ARGV[1], 'subject', ARGV[2], 'effect', ARGV[3],
    'request', ARGV[4], 'provider_key', ARGV[5], 'state', 'pending', 'sends', 0,
    'created_at', now, 'updated_at', now)
  redis.call('ZADD', INDEX.pending, now, KEYS[1])
end
return redis.call('HGETALL', KEYS[1])
