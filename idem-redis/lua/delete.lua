-- KEYS[1]: the record. Unfenced, for operators: deletes whatever is there.
-- Reply: 1 if a live record was deleted, 0 if none was (absent, or past
-- retention by the server's clock, which counts as absent).
local exp = tonumber(redis.call('HGET', KEYS[1], 'exp'))
redis.call('DEL', KEYS[1])
if exp and exp > server_now() then return 1 end
return 0
