-- The claim decision table, atomically (a script runs alone on the server).
-- KEYS[1]: the record. ARGV: fingerprint, owner, lease ms, retention ms.
-- Replies: {'claimed', attempt, lease_expires_ms, checkpoint_name, checkpoint_data}
--          {'in_progress', retry_after_ms} | {'completed', status, headers, body} | {'mismatch'}
local now = server_now()
local lease_ms = tonumber(ARGV[3])
local keep = math.max(lease_ms, tonumber(ARGV[4]))
local r = redis.call('HMGET', KEYS[1], 'fp', 'st', 'lease', 'exp', 'att', 'own')
local exp = tonumber(r[4])

if not r[1] or not exp or exp <= now then
  -- Absent, or past retention (which counts as absent).
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'own', ARGV[2], 'att', 1, 'st', 'f',
    'lease', now + lease_ms, 'exp', now + keep)
  redis.call('PEXPIREAT', KEYS[1], now + keep)
  return {'claimed', 1, now + lease_ms, false, false}
end

if r[1] ~= ARGV[1] then
  return {'mismatch'}
end

if r[2] == 'c' then
  local resp = redis.call('HMGET', KEYS[1], 'rs', 'rh', 'rb')
  return {'completed', tonumber(resp[1]), resp[2], resp[3]}
end

local lease = tonumber(r[3])
if r[6] == ARGV[2] then
  -- This very claim, delivered again: answer as the first delivery did.
  local cp = redis.call('HMGET', KEYS[1], 'cpn', 'cpd')
  return {'claimed', tonumber(r[5]), lease, cp[1], cp[2]}
end
if lease > now then
  return {'in_progress', lease - now}
end

-- The lease expired: take over, carrying the checkpoint.
local attempt = tonumber(r[5]) + 1
local new_exp = math.max(exp, now + keep)
redis.call('HSET', KEYS[1], 'own', ARGV[2], 'att', attempt, 'lease', now + lease_ms, 'exp', new_exp)
redis.call('PEXPIREAT', KEYS[1], new_exp)
local cp = redis.call('HMGET', KEYS[1], 'cpn', 'cpd')
return {'claimed', attempt, now + lease_ms, cp[1], cp[2]}
