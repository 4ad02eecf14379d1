"""The retrieval service's answer cache: an LRU bounded in bytes as well as entries, keyed by digests.

A GRPO group sends the same query n times, so the service (``server.py``) answers repeats from
here. Two things make a cache a memory leak under a hostile client, and both were measured here:
bounded in entries only, a cache of long queries kept ~15 MB per request and never gave it back
(725 MB after 40 requests); and keyed by the query text, every entry held its query. So an entry is
keyed by a 16-byte ``digest`` of ``(query, k, candidates)`` and holds only ``(doc id, score)``
pairs (passages are rebuilt from the index when answering); its size is estimated from the number
of hits (``entry_bytes``, measured on CPython 3.11 and checked by tests/retrieval), and the oldest
entries go once either bound is passed. The searches in flight are keyed by the same digest.
"""

from __future__ import annotations

import collections
import hashlib
import json
from collections.abc import Iterator

from memsearch.retrieval.service_requests import Hits, Key

Digest = bytes  # what the cache and the searches in flight are keyed by (``digest``)

# Approximate bytes one cache entry holds (16-byte digest key, OrderedDict slot, the hits tuple)
# and each of its hits (a (doc id, score) tuple and its float; the doc id string is the index's
# own): measured with sys.getsizeof on CPython 3.11, checked by tests/retrieval.
CACHE_ENTRY_BYTES = 200
CACHE_HIT_BYTES = 88


def entry_bytes(hits: Hits) -> int:
    """Approximate bytes the cache holds for one entry with these hits (``CACHE_ENTRY_BYTES``)."""
    return CACHE_ENTRY_BYTES + CACHE_HIT_BYTES * len(hits)


def digest(key: Key, memo: dict[int, bytes] | None = None) -> Digest:
    """16 bytes standing for ``(query, k, candidates)``: the cache and the searches in flight are
    keyed by it, so neither holds query text (a cache of 10,000 long queries held gigabytes).
    ``memo`` (id of a candidates tuple -> its digest, for one request) hashes a candidate list
    given for every query once, not once per query."""
    query, k, candidates = key
    h = hashlib.blake2b(repr((query, k)).encode(), digest_size=16)  # repr escapes lone surrogates
    if candidates is not None:
        part = None if memo is None else memo.get(id(candidates))
        if part is None:
            part = hashlib.blake2b(json.dumps(candidates).encode(), digest_size=16).digest()
            if memo is not None:
                memo[id(candidates)] = part
        h.update(b"\x01" + part)
    return h.digest()


class HitCache:
    """Least recently used ``digest -> hits``, at most ``max_entries`` entries and ``max_bytes``
    bytes (``entry_bytes``); either 0 keeps nothing. An entry larger than ``max_bytes`` on its own
    is not kept (it would evict everything else)."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: collections.OrderedDict[Digest, Hits] = collections.OrderedDict()
        self.bytes = 0  # the sum of entry_bytes over the entries held

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Digest) -> bool:
        return key in self._entries

    def items(self) -> Iterator[tuple[Digest, Hits]]:
        return iter(self._entries.items())

    def get(self, key: Digest) -> Hits | None:
        """The hits cached for ``key`` (now the most recently used), or ``None``."""
        hits = self._entries.get(key)
        if hits is not None:
            self._entries.move_to_end(key)
        return hits

    def put(self, key: Digest, hits: Hits) -> None:
        """Keep ``hits`` for ``key``, evicting the least recently used entries over either bound."""
        size = entry_bytes(hits)
        if self.max_entries <= 0 or size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= entry_bytes(old)
        self._entries[key] = hits
        self.bytes += size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= entry_bytes(evicted)
