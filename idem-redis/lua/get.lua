-- KEYS[1]: the record. Reply: its fields, or an empty array if absent or
-- past retention (judged, like every decision, by the server's clock).
local r = redis.call('HGETALL', KEYS[1])
local exp = tonumber(redis.call('HGET', KEYS[1], 'exp'))
if not exp or exp <= server_now() then return {} end
return r
