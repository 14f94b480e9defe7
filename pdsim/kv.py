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
    __slots__ = ("n", "epoch", "freed")

    def __init__(self, n: int, epoch: int) -> None:
        self.n = n
        self.epoch = epoch
        self.freed = False


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
        return Pages(n, self.epoch)

    def book(self, n: int) -> None:
        """Count ``n`` pages the caller found free and added to holdings of this epoch (what
        ``grow`` does for such a holding, for several growths at once:
        ``pdsim.decode.DecodeRank._grow_due``)."""
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
    """

    def __init__(self, allocator: PageAllocator, block_tokens: int) -> None:
        self.alloc = allocator
        self.block_tokens = block_tokens
        self.block_pages = allocator.pages_for(block_tokens)
        self.blocks: OrderedDict[int, int] = OrderedDict()  # block id -> its pages' epoch
        # the allocator epoch of every cached block's pages until a flush (reset) leaves
        # orphans: while the allocator is still in it, evicting a block frees block_pages
        self._epoch = allocator.epoch

    @property
    def pages(self) -> int:
        return len(self.blocks) * self.block_pages

    def match(self, block_ids: tuple[int, ...]) -> int:
        n = 0
        blocks = self.blocks
        for b in block_ids:
            if b not in blocks:
                break
            blocks.move_to_end(b)
            n += 1
        return n

    def insert(self, block_ids: tuple[int, ...]) -> None:
        blocks, alloc, need = self.blocks, self.alloc, self.block_pages
        move, epoch, capacity = blocks.move_to_end, alloc.epoch, alloc.capacity
        clean = epoch == self._epoch  # no orphans (see evict)
        used = alloc.used  # (kept here between evictions: allocations only add to it)
        for b in block_ids:
            if b in blocks:
                move(b)
                continue
            if capacity - used < need:
                if used > alloc.peak:  # (a high point: evictions come next)
                    alloc.peak = used
                if clean and blocks and used <= capacity:  # evict(need), inline: the least
                    blocks.popitem(False)  # recent block's pages are the ones missing
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

    def evict(self, need_pages: int) -> bool:
        """Evict LRU blocks until ``need_pages`` are free; False if the cache cannot give them."""
        alloc, blocks, n = self.alloc, self.blocks, self.block_pages
        pop, epoch = blocks.popitem, alloc.epoch
        free = alloc.capacity - alloc.used
        if free < need_pages and epoch == self._epoch:  # no orphans: each block frees n pages
            k = -(-(need_pages - free) // n)
            if len(blocks) < k:  # (min(k, len(blocks)), without the builtin's call)
                k = len(blocks)
            for b in list(islice(blocks, k)):  # the k least recent (popitem(False) k times,
                del blocks[b]  # which costs ~25% more per block)
            free += k * n
        while free < need_pages and blocks:
            if pop(last=False)[1] == epoch:  # (alloc.release of the block's pages)
                free += n
        alloc.used = alloc.capacity - free
        if alloc.used < 0:
            raise KVError("pages in use went negative")
        return free >= need_pages

    def reset(self) -> None:
        """Flush: drop every block (their pages are freed by the allocator reset)."""
        self.blocks.clear()
        self._epoch = self.alloc.epoch
