-- Shared prelude of the journal's writing scripts. KEYS[1] is the
-- operation's hash; KEYS[2..] are its namespace's listing indexes, one sorted
-- set per state (`...:state:<state>`), scored by updated_at (unix ms), whose
-- members are the keys of the operations' hashes. Every key shares the
-- namespace's hash tag, so a script touching them all stays in one cluster
-- slot. Each index is found by the state its key names, not by its place.
local INDEX = {}
for i = 2, #KEYS do
  local state = string.match(KEYS[i], ':state:([a-z_]+)$')
  if state then
    INDEX[state] = KEYS[i]
  end
end

-- A settled state is final: nothing overwrites it, nobody leases it.
local function settled(state)
  return state == 'succeeded' or state == 'failed'
end

-- Whether `owner` holds a live lease, from the stored owner and end.
local function held_by(stored_owner, stored_until, owner, now)
  local until_ms = tonumber(stored_until)
  return stored_owner == owner and until_ms ~= nil and until_ms > now
end

-- The listing index of `state`; a state no script writes is a corrupt record.
local function index_of(state)
  local index = INDEX[state]
  if not index then
    return error('idem: corrupt journal state')
  end
  return index
end
