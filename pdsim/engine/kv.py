"""KV page allocator and prefix (radix) cache of one DP rank.

The allocator hands out :class:`Pages` (a holder's share of the pool). A flush bumps the
allocator's epoch and makes every page free again; pages allocated before the flush become
orphans whose later release is a no-op, so pages handed out after the flush belong to their new
owners and nothing is freed twice.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice


class KVError(RuntimeError):
    """An allocator invariant was broken (double free, over-allocation)."""


class Pages:
    """A holder's pages: how many, the allocator epoch they were taken in, and whether they
    were released. Made by :meth:`PageAllocator.alloc` only, which sets the fields (a class
    without a Python ``__init__`` is made for half the cost: no call from C back into the
    interpreter; two are made per request)."""

    __slots__ = ("n", "epoch", "freed")


class PageAllocator:
    def __init__(self, capacity_pages: int, page_size: int) -> None:
        if capacity_pages <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity_pages
        self.page_size = page_size
        self.used = 0
        self.epoch = 0
        self.peak = 0

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def alloc(self, n: int) -> Pages | None:
        """Allocate ``n`` pages, or return None when they are not free."""
        if n > self.capacity - self.used:
            return None
        self.used += n
        if self.used > self.peak:
            self.peak = self.used
        pages = Pages()
        pages.n, pages.epoch, pages.freed = n, self.epoch, False
        return pages

    def book(self, n: int) -> None:
        """Count ``n`` pages the caller found free and added to holdings of this epoch (what
        ``grow`` does for such a holding, for several growths at once:
        ``pdsim.engine.decode_batch.RunningBatch._grow_due``)."""
        self.used += n
        if self.used > self.peak:
            self.peak = self.used

    def grow(self, pages: Pages, n: int) -> bool:
        """Add ``n`` pages to a holding; an orphaned holding re-enters the current epoch."""
        if n > self.capacity - self.used:
            return False
        if pages.epoch != self.epoch:  # orphan from before a flush: it now owns only the new pages
            pages.n, pages.epoch = 0, self.epoch
        pages.n += n
        self.used += n
        if self.used > self.peak:
            self.peak = self.used
        return True

    def release(self, pages: Pages | None) -> None:
        if pages is None:
            return
        if pages.freed:
            raise KVError("double free of a page holding")
        pages.freed = True
        if pages.epoch == self.epoch:
            self.used -= pages.n
            if self.used < 0:
                raise KVError("pages in use went negative")

    def reset(self) -> None:
        """Flush: every page free again; existing holdings become orphans."""
        self.used = 0
        self.epoch += 1


class PrefixCache:
    """LRU over prefix blocks (radix cache at block granularity).

    Cached blocks keep their pages in the allocator until evicted. ``match`` returns how many
    leading blocks of a prompt are cached. Every block holds ``block_pages`` pages, so the
    cache keeps, per block, only the allocator epoch its pages were taken in (a holding
    from before a flush is an orphan: evicting it frees nothing).

    A prompt's blocks given as a ``range`` are private: no other prompt has any of them, and
    they are inserted once (pdsim.engine.client's random prompts). Inserted, they are the most
    recent blocks, in order, and no look-up ever moves one of them again, so they stay together in
    the LRU order and leave it from their first on: the cache keeps them as one entry, the
    range of those still cached (its last ones), instead of one per block, with the same
    evictions, use and peak (tests/test_units.py compares it block by block).
    """

    def __init__(self, allocator: PageAllocator, block_tokens: int) -> None:
        self.alloc = allocator
        self.block_tokens = block_tokens
        self.block_pages = allocator.pages_for(block_tokens)
        # block id (or a private run's range, see above) -> its pages' epoch
        self.blocks: OrderedDict[int | range, int] = OrderedDict()
        # the allocator epoch of every cached block's pages until a flush (reset) leaves
        # orphans: while the allocator is still in it, evicting a block frees block_pages
        self._epoch = allocator.epoch
        self.runs = 0  # how many ``blocks`` keys are runs (ranges)

    @property
    def pages(self) -> int:
        n = len(self.blocks)
        if self.runs:
            n += sum(len(r) - 1 for r in self.blocks if type(r) is range)
        return n * self.block_pages

    def cached(self) -> list[int]:
        """The cached block ids, least recent first (a run's as the blocks it stands for)."""
        out: list[int] = []
        for b in self.blocks:
            if type(b) is range:
                out.extend(b)
            else:
                out.append(b)
        return out

    def match(self, block_ids: tuple[int, ...]) -> int:
        n = 0
        blocks = self.blocks
        for b in block_ids:
            if b not in blocks:
                break
            blocks.move_to_end(b)
            n += 1
        return n

    def insert(self, block_ids: tuple[int, ...] | range) -> None:
        if type(block_ids) is range and self._insert_run(block_ids):
            return
        blocks, alloc, need = self.blocks, self.alloc, self.block_pages
        move, epoch, capacity = blocks.move_to_end, alloc.epoch, alloc.capacity
        clean = epoch == self._epoch  # no orphans (see evict)
        runs = self.runs  # (evictions only lower it)
        used = alloc.used  # (kept here between evictions: allocations only add to it)
        for b in block_ids:
            if b in blocks:
                move(b)
                continue
            if capacity - used < need:
                if used > alloc.peak:  # (a high point: evictions come next)
                    alloc.peak = used
                if clean and blocks and used <= capacity:  # evict(need), inline: the least
                    if runs:  # recent block's pages are the ones missing
                        self._drop(1)
                    else:
                        blocks.popitem(False)
                    used -= need
                    if used < 0:
                        raise KVError("pages in use went negative")
                else:
                    alloc.used = used
                    if not self.evict(need):
                        return
                    used = alloc.used
            used += need  # alloc.alloc(need), which cannot fail here
            blocks[b] = epoch
        if used > alloc.peak:
            alloc.peak = used
        alloc.used = used

    def _insert_run(self, ids: range) -> bool:
        """Insert a prompt's private blocks (see the class docstring) as one run: what
        inserting them block by block does, when no cached block is an orphan (else False:
        the caller inserts them block by block). Each that does not fit takes the place of the
        least recent block, the run's own first ones once the older ones are gone."""
        alloc, need = self.alloc, self.block_pages
        used, capacity = alloc.used, alloc.capacity
        if alloc.epoch != self._epoch or used > capacity:
            return False
        m = len(ids)
        fit = (capacity - used) // need  # blocks that fit without evicting
        if fit < m:
            dropped = self._drop(m - fit)  # (each frees one block's pages)
            if dropped < m - fit:  # no older block left: the run's own first ones went
                m = fit + dropped
                ids = ids[len(ids) - m:]
            used -= dropped * need
        if m:
            self.blocks[ids] = alloc.epoch
            self.runs += 1
            used += m * need
        # (the highest use: the blocks that fit, then one block's pages out and in per block)
        if used > alloc.peak:
            alloc.peak = used
        alloc.used = used
        return True

    def _drop(self, k: int) -> int:
        """Drop the ``k`` least recent blocks (fewer if fewer are cached); returns how many.
        The caller frees their pages (none are orphans)."""
        blocks = self.blocks
        if not self.runs:
            if len(blocks) < k:  # (min(k, len(blocks)), without the builtin's call)
                k = len(blocks)
            for b in list(islice(blocks, k)):  # the k least recent (popitem(False) k times,
                del blocks[b]  # which costs ~25% more per block)
            return k
        dropped = 0
        while dropped < k and blocks:
            b, e = blocks.popitem(last=False)
            if type(b) is range:
                take = k - dropped
                if take < len(b):  # its first ``take`` go; the rest stays, at the front
                    self._put_first(b[take:], e)
                    return k
                take = len(b)
                self.runs -= 1
            else:
                take = 1
            dropped += take
        return dropped

    def _put_first(self, b: int | range, epoch: int) -> None:
        """Make ``b`` the least recent entry."""
        self.blocks[b] = epoch
        self.blocks.move_to_end(b, last=False)

    def evict(self, need_pages: int) -> bool:
        """Evict LRU blocks until ``need_pages`` are free; False if the cache cannot give them."""
        alloc, blocks, n = self.alloc, self.blocks, self.block_pages
        epoch = alloc.epoch
        free = alloc.capacity - alloc.used
        if free < need_pages and epoch == self._epoch:  # no orphans: each block frees n pages
            free += self._drop(-(-(need_pages - free) // n)) * n
        while free < need_pages and blocks:  # orphans: a block frees pages if it is not one
            b, e = blocks.popitem(last=False)
            if type(b) is not range:
                if e == epoch:  # (alloc.release of the block's pages)
                    free += n
                continue
            self.runs -= 1  # a run is inserted only while no block is an orphan (_insert_run)
            if e == epoch:  # and reset() clears them all, so it is an orphan here; if not,
                free += len(b) * n  # its pages are freed with it
        alloc.used = alloc.capacity - free
        if alloc.used < 0:
            raise KVError("pages in use went negative")
        return free >= need_pages

    def reset(self) -> None:
        """Flush: drop every block (their pages are freed by the allocator reset)."""
        self.blocks.clear()
        self.runs = 0
        self._epoch = self.alloc.epoch
