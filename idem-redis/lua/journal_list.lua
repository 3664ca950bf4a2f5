-- The operations of one namespace in the given states, unchanged for ARGV[1]
-- ms by the server's clock, oldest change first, at most ARGV[2].
-- KEYS: the namespace's listing index of each state asked for (members in
-- the same hash tag, so the hashes read here share their slot).
-- Replies one hash per operation.
local cutoff = server_now() - tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local found = {}
for _, index in ipairs(KEYS) do
  -- Each index gives at most `limit` of its oldest: no more can be listed.
  local hits = redis.call('ZRANGEBYSCORE', index, '-inf', cutoff, 'WITHSCORES', 'LIMIT', 0, limit)
  for i = 1, #hits, 2 do
    found[#found + 1] = {tonumber(hits[i + 1]), hits[i]}
  end
end
-- Ties in time go by key, so pages of a listing come in one order.
table.sort(found, function(a, b)
  if a[1] ~= b[1] then
    return a[1] < b[1]
  end
  return a[2] < b[2]
end)
local out = {}
for i = 1, math.min(limit, #found) do
  local hash = redis.call('HGETALL', found[i][2])
  if #hash > 0 then
    out[#out + 1] = hash
  end
end
return out
