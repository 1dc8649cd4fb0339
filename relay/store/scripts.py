"""The Lua scripts :class:`~relay.store.glide.GlideStore` runs: each is one atomic step on the
server (``EVALSHA``; every key it touches is passed in ``KEYS``, so a cluster can route it)."""

from __future__ import annotations

from protocol_specs.link.relay import AppendOutcome

__all__ = ["APPEND", "APPEND_BATCH", "APPEND_ONCE", "OUTCOMES", "SET_VERSIONED", "TRIM_RECEIVED"]

#: what :data:`APPEND_ONCE` (and each answer of :data:`APPEND_BATCH`) answers first, by its code
OUTCOMES = {
    1: AppendOutcome.STORED,
    0: AppendOutcome.DUPLICATE,
    -1: AppendOutcome.GAP,
    -2: AppendOutcome.FULL,
    2: AppendOutcome.SKIPPED,
}

#: The text of an append's notice (``relay/store/base.py``, ``notice_from``): the entry itself
#: when its payload is at most ``max`` bytes, else its id alone. Shared by the appending scripts.
_NOTICE = """
local function notice(prev, id, n, producer, stream, payload, max)
  if string.len(payload) <= max then
    return 'p ' .. prev .. ' ' .. id .. ' ' .. n .. ' ' .. string.len(producer) .. ' ' .. stream
      .. '\\n' .. producer .. payload
  end
  return 'n ' .. prev .. ' ' .. id .. ' ' .. stream
end
"""

#: KEYS: stream, meta, transient list. ARGV: producer, n, payload, transient (0/1), max entries,
#: max bytes, skip (0/1), diverted maxlen; KEYS[4]: the stream to store in (KEYS[1] unless
#: diverted), KEYS[5] its meta hash, KEYS[6] its watchers; ARGV[9] the notice channel prefix,
#: ARGV[10] the listener not to notify, ARGV[11] the largest payload a notice carries. Returns
#: {outcome, cursor-or-number, prev}: an outcome's code (:data:`OUTCOMES`). A stored
#: entry's notice goes to its watchers (``relay/store/base.py``, ``notice_from``). An entry
#: stored in KEYS[1] names its publish: fields ``o`` (producer) and ``n`` beside ``p``.
APPEND_ONCE = (
    _NOTICE
    + """
local function notify(prev, id, producer, n)
  local text
  for _, listener in ipairs(redis.call('SMEMBERS', KEYS[6])) do
    if listener ~= ARGV[10] then
      text = text or notice(prev, id, n, producer, KEYS[4], ARGV[3], tonumber(ARGV[11]))
      redis.call('PUBLISH', ARGV[9] .. listener, text)
    end
  end
end
local last = tonumber(redis.call('HGET', KEYS[2], 'n:' .. ARGV[1]) or '0')
local n = tonumber(ARGV[2])
if n <= last then
  if n == last then return {0, redis.call('HGET', KEYS[2], 'c:' .. ARGV[1]) or ''} end
  return {0, ''}
end
if n ~= last + 1 then return {-1, tostring(last)} end
if ARGV[7] == '1' then
  redis.call('HSET', KEYS[2], 'n:' .. ARGV[1], n, 'c:' .. ARGV[1], '')
  return {2, ''}
end
if KEYS[4] ~= KEYS[1] then
  local did
  if tonumber(ARGV[8]) > 0 then
    did = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[8], '*', 'p', ARGV[3])
  else
    did = redis.call('XADD', KEYS[4], '*', 'p', ARGV[3])
  end
  redis.call('HSET', KEYS[2], 'n:' .. ARGV[1], n, 'c:' .. ARGV[1], did)
  local dprev = redis.call('HGET', KEYS[5], 'last') or '0-0'
  redis.call('HSET', KEYS[5], 'last', did)
  notify(dprev, did, '', '0')
  return {1, did, dprev}
end
local size = string.len(ARGV[3])
local max_entries = tonumber(ARGV[5])
local max_bytes = tonumber(ARGV[6])
local held = redis.call('XLEN', KEYS[1])
local bytes = tonumber(redis.call('HGET', KEYS[2], 'bytes') or '0')
if (max_entries > 0 and held >= max_entries) or (max_bytes > 0 and bytes + size > max_bytes) then
  redis.call('HSET', KEYS[2], 'n:' .. ARGV[1], n, 'c:' .. ARGV[1], '')
  return {-2, tostring(held)}
end
local id = redis.call('XADD', KEYS[1], '*', 'p', ARGV[3], 'o', ARGV[1], 'n', ARGV[2])
local prev = redis.call('HGET', KEYS[2], 'last') or '0-0'
redis.call('HSET', KEYS[2], 'n:' .. ARGV[1], n, 'c:' .. ARGV[1], id, 'last', id)
redis.call('HINCRBY', KEYS[2], 'bytes', size)
if ARGV[4] == '1' then redis.call('RPUSH', KEYS[3], id .. ' ' .. size) end
notify(prev, id, ARGV[1], ARGV[2])
return {1, id, prev}
"""
)

#: APPEND_ONCE for several consecutive entries of one producer, into the stream itself (no
#: diversion, no skip). KEYS: stream, meta, transient list, watchers. ARGV: producer, max entries,
#: max bytes, notice channel prefix, listener not to notify, the largest payload a notice carries,
#: then per entry: n, payload, transient (0/1). Returns APPEND_ONCE's reply per entry, in order.
APPEND_BATCH = (
    _NOTICE
    + """
local producer = ARGV[1]
local max_entries = tonumber(ARGV[2])
local max_bytes = tonumber(ARGV[3])
local listeners = redis.call('SMEMBERS', KEYS[4])
local last = tonumber(redis.call('HGET', KEYS[2], 'n:' .. producer) or '0')
local held = redis.call('XLEN', KEYS[1])
local bytes = tonumber(redis.call('HGET', KEYS[2], 'bytes') or '0')
local added = 0
local prev = redis.call('HGET', KEYS[2], 'last') or '0-0'
local notice_max = tonumber(ARGV[6])
local out = {}
for i = 7, #ARGV, 3 do
  local n = tonumber(ARGV[i])
  local payload = ARGV[i + 1]
  local size = string.len(payload)
  if n <= last then
    if n == last then
      out[#out + 1] = {0, redis.call('HGET', KEYS[2], 'c:' .. producer) or ''}
    else
      out[#out + 1] = {0, ''}
    end
  elseif n ~= last + 1 then
    out[#out + 1] = {-1, tostring(last)}
  elseif (max_entries > 0 and held >= max_entries) or (max_bytes > 0 and bytes + size > max_bytes) then
    redis.call('HSET', KEYS[2], 'n:' .. producer, n, 'c:' .. producer, '')
    last = n
    out[#out + 1] = {-2, tostring(held)}
  else
    local id = redis.call('XADD', KEYS[1], '*', 'p', payload, 'o', producer, 'n', n)
    redis.call('HSET', KEYS[2], 'n:' .. producer, n, 'c:' .. producer, id, 'last', id)
    if ARGV[i + 2] == '1' then redis.call('RPUSH', KEYS[3], id .. ' ' .. size) end
    local text
    for _, listener in ipairs(listeners) do
      if listener ~= ARGV[5] then
        text = text or notice(prev, id, ARGV[i], producer, KEYS[1], payload, notice_max)
        redis.call('PUBLISH', ARGV[4] .. listener, text)
      end
    end
    out[#out + 1] = {1, id, prev}
    last, held, bytes, added, prev = n, held + 1, bytes + size, added + size, id
  end
end
if added > 0 then redis.call('HINCRBY', KEYS[2], 'bytes', added) end
return out
"""
)

#: KEYS: stream, meta, watchers. ARGV: payload, exact maxlen (-1: none), notice channel prefix,
#: the largest payload a notice carries. Returns the entry's id.
APPEND = (
    _NOTICE
    + """
local id
if tonumber(ARGV[2]) >= 0 then
  id = redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[2], '*', 'p', ARGV[1])
else
  id = redis.call('XADD', KEYS[1], '*', 'p', ARGV[1])
end
local prev = redis.call('HGET', KEYS[2], 'last') or '0-0'
redis.call('HSET', KEYS[2], 'last', id)
local text
for _, listener in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  text = text or notice(prev, id, '0', '', KEYS[1], ARGV[1], tonumber(ARGV[4]))
  redis.call('PUBLISH', ARGV[3] .. listener, text)
end
return id
"""
)

#: KEYS: stream, meta, transient list. ARGV: cursor ms, cursor seq, limit. Returns entries deleted.
TRIM_RECEIVED = """
local cms = tonumber(ARGV[1])
local cseq = tonumber(ARGV[2])
local head = redis.call('LRANGE', KEYS[3], 0, tonumber(ARGV[3]) - 1)
local removed = 0
local freed = 0
for _, item in ipairs(head) do
  local ms, seq, size = string.match(item, '^(%d+)-(%d+) (%d+)$')
  ms = tonumber(ms)
  seq = tonumber(seq)
  if ms > cms or (ms == cms and seq > cseq) then break end
  redis.call('XDEL', KEYS[1], ms .. '-' .. seq)
  freed = freed + tonumber(size)
  removed = removed + 1
end
if removed > 0 then
  redis.call('LTRIM', KEYS[3], removed, -1)
  redis.call('HINCRBY', KEYS[2], 'bytes', -freed)
end
return removed
"""

#: KEYS: the hash. ARGV: field, value, the version the writer read, the version field.
#: Returns 1 (written, version + 1) or 0 (the version moved on: nothing written).
SET_VERSIONED = """
local v = tonumber(redis.call('HGET', KEYS[1], ARGV[4]) or '0')
if v ~= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], ARGV[4], v + 1)
return 1
"""
