"""The Lua scripts that make each store operation on one scope atomic.

Every key a script touches shares the scope's hash tag, so the scripts run unchanged on Redis,
Valkey and a Redis Cluster. Keys derived inside a script (an entry key from its id) are built from a
prefix passed in ARGV; they are in the same slot as the declared keys by construction.

Knows the key roles documented in `semantic/store/entries.py`; nothing else.
"""

from __future__ import annotations

# KEYS: exact key, entry key, members zset, scope meta.
# ARGV: entry id, ttl ms (0 = none), created, entry-key prefix, tenant, model, min created, then the
# entry's fields. An entry already under the exact key stays, unless created before `min created`:
# then it is replaced (a caller asking for answers fresher than it has just made a new one).
# Returns {id now stored under the exact key, id of the entry replaced or ''}.
PUT_ENTRY = """
local replaced = ''
local existing = redis.call('GET', KEYS[1])
if existing then
  local existing_key = ARGV[4] .. existing
  local created = redis.call('HGET', existing_key, 'created')
  if created and tonumber(created) >= tonumber(ARGV[7]) then
    return {existing, ''}
  end
  if created then
    redis.call('DEL', existing_key)
    redis.call('ZREM', KEYS[3], existing)
    replaced = existing
  end
end
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[2], unpack(ARGV, 8))
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
else
  redis.call('SET', KEYS[1], ARGV[1])
end
local scope_ttl = redis.call('PTTL', KEYS[3])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[4], 'tenant', ARGV[5], 'model', ARGV[6])
-- The scope's own keys live as long as its longest-lived entry.
if ttl == 0 or scope_ttl == -1 then
  redis.call('PERSIST', KEYS[3])
  redis.call('PERSIST', KEYS[4])
elseif scope_ttl == -2 or scope_ttl < ttl then
  redis.call('PEXPIRE', KEYS[3], ttl)
  redis.call('PEXPIRE', KEYS[4], ttl)
end
return {ARGV[1], replaced}
"""

# KEYS: exact key.  ARGV: entry-key prefix, min created, hits to count, then the fields to return.
# Returns the fields of the live entry under the exact key (counting the hits), or nil.
GET_EXACT = """
local entry_id = redis.call('GET', KEYS[1])
if not entry_id then
  return nil
end
local key = ARGV[1] .. entry_id
local created = redis.call('HGET', key, 'created')
if not created or tonumber(created) < tonumber(ARGV[2]) then
  return nil
end
redis.call('HINCRBY', key, 'hits', ARGV[3])
return redis.call('HMGET', key, unpack(ARGV, 4))
"""

# KEYS: exact key of another wording, entry key, the entry's alias set, that wording's vetoes.  ARGV: entry
# id, that exact key's suffix. After a semantic hit, points the new wording's exact key at the entry it was
# served, for as long as the entry lives (and only if nothing holds that key yet); the alias set lets a
# delete find it. Returns 1 when remembered, 0 when the entry is gone, the key was taken, or the pair was
# vetoed meanwhile (a lookup that judged before the veto must not make the wording an exact hit after it).
REMEMBER_ALIAS = """
local ttl = redis.call('PTTL', KEYS[2])
if ttl == -2 then
  return 0
end
local stored_key = redis.call('HGET', KEYS[2], 'exact')
if stored_key and redis.call('SISMEMBER', KEYS[4], stored_key) == 1 then
  return 0
end
local stored
if ttl > 0 then
  stored = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ttl)
else
  stored = redis.call('SET', KEYS[1], ARGV[1], 'NX')
end
if not stored then
  return 0
end
redis.call('SADD', KEYS[3], ARGV[2])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[3], ttl)
end
return 1
"""

# KEYS: exact key of a wording, that wording's vetoes, the alias set of the entry it was served.  ARGV: entry
# id, the exact key the entry was stored under, the wording's exact-key suffix. A hit reported wrong: the
# stored prompt joins the wording's vetoes (no TTL: the pair of prompts outlives any one entry), and a
# remembered alias from the wording to the entry goes, atomically with `REMEMBER_ALIAS`.
VETO_PAIR = """
redis.call('SADD', KEYS[2], ARGV[2])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
redis.call('SREM', KEYS[3], ARGV[3])
return 1
"""

# KEYS: entry key.  Counts a hit on an entry that still exists (never resurrects a deleted one).
RECORD_HIT = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('HINCRBY', KEYS[1], 'hits', 1)
end
return nil
"""

# KEYS: members zset, scope meta.  ARGV: entry-key prefix, exact-key prefix, alias-set prefix, then entry ids.
# Deletes each entry, its exact key and the exact keys remembered for it (each only if still pointing at
# it), forgets every id from the scope (including ids whose entry already expired), and drops the meta
# with the last member. Returns the ids whose entry existed.
DELETE_ENTRIES = """
local deleted = {}
for index = 4, #ARGV do
  local entry_id = ARGV[index]
  local key = ARGV[1] .. entry_id
  local aliases = ARGV[3] .. entry_id
  for _, alias in ipairs(redis.call('SMEMBERS', aliases)) do
    local alias_key = ARGV[2] .. alias
    if redis.call('GET', alias_key) == entry_id then
      redis.call('DEL', alias_key)
    end
  end
  redis.call('DEL', aliases)
  local exact = redis.call('HGET', key, 'exact')
  if exact then
    local exact_key = ARGV[2] .. exact
    if redis.call('GET', exact_key) == entry_id then
      redis.call('DEL', exact_key)
    end
    redis.call('DEL', key)
    deleted[#deleted + 1] = entry_id
  end
  redis.call('ZREM', KEYS[1], entry_id)
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[2])
end
return deleted
"""
