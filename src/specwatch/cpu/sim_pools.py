"""The pool, allocator and request the allocator simulation drives, from one release's classes.

``sim_classes`` picks the release (``rules.release_classes``); ``make_allocator`` builds its
token-to-KV allocator on the CPU (the paged one on the host path where its ``alloc_extend`` would
launch Triton: ``cpu.allocator_sim``'s module doc); ``SimRequest`` is the part of SGLang's ``Req``
its ``ReqToTokenPool`` reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


def sim_classes(release_version: Optional[str]):
    """The classes a simulation runs: ``release_version``'s unpacked source, or the installed
    SGLang's (None). A release whose source is absent: ``SpecwatchInputError`` naming ``--release``."""
    from specwatch.rules.release_classes import installed_classes, release_classes

    return release_classes(release_version) if release_version else installed_classes()


def make_allocator(size: int, page_size: int, classes=None):
    """``classes``'s allocator (default: the installed SGLang's) of ``size`` slots on the CPU."""
    import torch

    from specwatch.rules.release_classes import installed_classes

    c = classes or installed_classes()
    if page_size == 1:
        return c.token_allocator(size, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
    if c.alloc_extend_on_host:
        alloc = c.paged_allocator(size, page_size, torch.bfloat16, "cpu", kvcache=None, need_sort=False)
        alloc.use_triton_kernels = False  # the release's own torch path (alloc_extend_naive)
        return alloc

    class HostPagedAllocator(c.paged_allocator):
        """The release's paged allocator with ``alloc_extend`` on its host path (see module doc)."""

        def alloc_extend(
            self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, num_new_pages=None
        ):
            out = torch.empty((extend_num_tokens,), dtype=torch.int64)
            c.alloc_extend_naive(prefix_lens, seq_lens, last_loc, self.free_pages, out, self.page_size, "cpu")
            if num_new_pages is None:
                num_new_pages = c.get_num_new_pages(
                    seq_lens=seq_lens_cpu, page_size=self.page_size, prefix_lens=prefix_lens_cpu
                )
            if num_new_pages > len(self.free_pages):
                return None
            self.free_pages = self.free_pages[num_new_pages:]
            return out

    return HostPagedAllocator(size, page_size, torch.bfloat16, "cpu", kvcache=None, need_sort=False)


def free_page_ids(allocator):
    """Every page id the allocator holds free (its ``get_all_free_pages`` where it has one)."""
    import torch

    if hasattr(allocator, "get_all_free_pages"):
        return allocator.get_all_free_pages()
    released = getattr(allocator, "release_pages", None)
    return allocator.free_pages if released is None else torch.cat((allocator.free_pages, released))


@dataclass
class SimRequest:
    """The fields of SGLang's Req that ReqToTokenPool reads: on the request itself (up to 0.5.22)
    or on its ``kv`` (``ReqKvInfo``, 0.5.23), which here is the request again."""

    idx: int
    req_pool_idx: Optional[int] = None
    inflight_middle_chunks: int = 0
    kv_committed_len: int = 0
    kv_allocated_len: int = 0
    target_len: int = 0

    @property
    def kv(self) -> "SimRequest":
        return self

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None
