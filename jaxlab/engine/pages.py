"""The host side of the paged KV cache: which pages are free, who holds which, and prefix reuse.

:class:`PagePool` hands out pages of the device pool (:mod:`jaxlab.engine.paged`) one at a time, as each
sequence grows; page 0 (the null page) is never handed out. Every page has a reference count: a page a
sequence holds counts 1, a page of a shared prompt prefix counts once per sequence reading it, and a page
goes back to the free list when its count reaches 0.

**Prefix reuse.** A *full* page of prompt tokens is registered under a hash of its tokens and of every
token before it (the previous page's hash chained in), so equal hashes mean equal prefixes, not only equal
pages. A new prompt whose first pages hash the same reads those pages instead of computing them again
(:meth:`PagePool.match_prefix`). A page whose count fell to 0 keeps its content and its hash until it is
handed out again: the free list is least-recently-freed first, so a prefix used a moment ago is the last
to be overwritten and can still be found.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Sequence

from jaxlab.errors import InvalidRequestError


def page_hashes(tokens: Sequence[int], page_size: int) -> list[bytes]:
    """The chained hash of every full page of ``tokens``: hash i covers tokens[: (i+1) * page_size]."""
    out, prev = [], b""
    for start in range(0, len(tokens) - page_size + 1, page_size):
        h = hashlib.blake2b(prev, digest_size=16)
        h.update(b",".join(str(int(t)).encode() for t in tokens[start : start + page_size]))
        prev = h.digest()
        out.append(prev)
    return out


class PagePool:
    """Free list, reference counts and the prefix table of a pool of ``num_pages`` pages of ``page_size``."""

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 2:
            raise InvalidRequestError(f"a page pool needs at least 2 pages (page 0 is the null page), got {num_pages}")
        self.num_pages, self.page_size = num_pages, page_size
        self.refs = [0] * num_pages
        self.free: OrderedDict[int, None] = OrderedDict((p, None) for p in range(1, num_pages))
        self.by_hash: dict[bytes, int] = {}
        self.hash_of: dict[int, bytes] = {}
        self.reused_pages = 0  # pages read from the prefix table instead of computed (a counter for reports)

    @property
    def capacity(self) -> int:
        """Pages a sequence can hold (all but the null page)."""
        return self.num_pages - 1

    @property
    def free_count(self) -> int:
        return len(self.free)

    @property
    def used(self) -> int:
        return self.capacity - len(self.free)

    def allocate(self) -> int | None:
        """A free page (its old prefix entry forgotten), its count 1; None when none is free."""
        if not self.free:
            return None
        page, _ = self.free.popitem(last=False)
        old = self.hash_of.pop(page, None)
        if old is not None and self.by_hash.get(old) == page:
            del self.by_hash[old]
        self.refs[page] = 1
        return page

    def release(self, pages: Sequence[int]) -> None:
        """Drop one reference to each page; a page no one holds goes back to the free list."""
        for page in pages:
            if page <= 0:
                continue
            if self.refs[page] <= 0:
                raise RuntimeError(f"page {page} released more often than it was taken")
            self.refs[page] -= 1
            if self.refs[page] == 0:
                self.free[page] = None

    def register(self, page: int, digest: bytes) -> None:
        """Make a full page of prompt tokens findable by its chained hash (the first page with a hash wins)."""
        if digest not in self.by_hash:
            self.by_hash[digest] = page
            self.hash_of[page] = digest

    def held_prefix(self, hashes: Sequence[bytes]) -> int:
        """How many pages of the longest registered prefix of ``hashes`` someone holds now: reading them takes
        no page from the free list (a registered page no one holds is on the free list, and reading it takes it)."""
        n = 0
        for digest in hashes:
            page = self.by_hash.get(digest)
            if page is None or self.refs[page] == 0:
                break
            n += 1
        return n

    def match_prefix(self, hashes: Sequence[bytes]) -> list[int]:
        """The pages of the longest registered prefix of ``hashes``, each taken (its count raised)."""
        pages = []
        for digest in hashes:
            page = self.by_hash.get(digest)
            if page is None:
                break
            if self.refs[page] == 0:
                del self.free[page]
            self.refs[page] += 1
            pages.append(page)
        self.reused_pages += len(pages)
        return pages
