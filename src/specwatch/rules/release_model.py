"""The shape of a release adapter: what specwatch needs to know about one range of SGLang releases.

``rules.release_ranges`` holds one ``ReleaseAdapter`` per range; ``rules.releases`` picks the one
for a version. Every value was read from the release's own wheel (``tests/test_releases.py``
checks each name, signature and match text against the release's Python).
"""

from __future__ import annotations

from enum import Enum
from typing import Optional

import yaml
from pydantic import BaseModel, ConfigDict


class WatermarkSite(str, Enum):
    """How a release computes the EAGLE decode watermark (``nxt``: the KV length a request is
    allocated up to before a decode step)."""

    inline_unaligned = "inline-unaligned"
    """``nxt = max(cur, committed + reserve)`` inside the EAGLE prepare function, no round-up to a
    whole page: the allocator's partial last page is never recorded (the unaligned-watermark bug
    class is the release's own behaviour)."""
    inline_aligned = "inline-aligned"
    """Rounded up to a whole page inside ``eagle_prepare_for_decode`` itself."""
    page_aligned_helper = "page-aligned-helper"
    """``allocation_sizing.page_aligned_decode_alloc_lens``, shared by EAGLE and DFLASH (and, from
    0.5.20, UNO and the NPU DSv4 allocator): one function computes every caller's watermark."""


class SizingArgs(str, Enum):
    """How SGLang's host-side sizing functions get the server configuration."""

    server_args = "server-args"
    """They take ``server_args`` as their argument (a duck-typed namespace with the fields they
    read works: ``memory_model.server_args_for``)."""
    runtime_context = "runtime-context"
    """They take no argument and read the published runtime context
    (``sglang.srt.runtime_context``: ``get_spec()``, ``get_schedule()``, ``get_parallel()``), which
    ``runtime_context.publish(server_args, role=...)`` fills; a namespace argument is a TypeError."""


class ServerArgsFields(str, Enum):
    """How the names of ``ServerArgs``'s fields can be listed without building one."""

    dataclass = "dataclass"
    """``ServerArgs`` is a dataclass: ``dataclasses.fields(ServerArgs)``."""
    signature = "signature"
    """``ServerArgs`` is assembled from ``arg_groups/fields/`` namespaces and is no dataclass:
    ``dataclasses.fields`` raises TypeError; ``inspect.signature(ServerArgs).parameters`` lists
    them."""


class FaultSite(BaseModel):
    """Where one specwatch fault edits a release, in the source patcher's terms."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    target: str
    """Dotted path of the function the source patcher edits (``module.function`` or
    ``module.Class.method``)."""
    module: str
    """Module whose import triggers the patch in SGLang's processes (``Fault.modules``)."""
    match: str
    """Lines the patcher finds in the target's source (compared stripped, must occur exactly once)."""
    replacement: str
    """Lines that replace ``match``; ``{hit}`` stands for the fault's hit-count expression
    (``inject.faults._hit(name)``, which evaluates to 0)."""

    def patch_yaml(self, hit: str) -> str:
        """The source patcher's configuration for this edit (``apply_patches_from_config``), with
        ``{hit}`` replaced by ``hit``, the fault's hit-count expression."""
        edit = {"match": self.match + "\n", "replacement": self.replacement.format(hit=hit) + "\n"}
        return yaml.safe_dump({"patches": [{"target": self.target, "edits": [edit]}]})


class ReleaseAdapter(BaseModel):
    """What specwatch needs to know about one range of SGLang releases (inclusive bounds)."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    first: str
    """First release of the range (``0.5.X``)."""
    last: str
    """Last release of the range (``0.5.X``)."""
    torch_pin: str
    """The ``torch==`` version the release's wheel requires (its ``Requires-Dist``)."""

    accept_histogram_key: Optional[str]
    """``meta_info`` key of the per-request acceptance histogram under its old name
    (``spec_accept_histogram``); None where the release no longer sends it."""
    correct_drafts_histogram_key: str
    """``meta_info`` key of the same histogram under its current name (sent by every known
    release): index i counts verify steps that accepted i draft tokens."""

    sizing_module: str
    """Module holding the per-decode sizing functions."""
    alloc_len_fn: str
    """Dotted path of the KV length one request may allocate per decode step."""
    alloc_reserve_fn: Optional[str]
    """Dotted path of the per-decode reserve (2 x alloc len); None where the release has none
    (the caller doubles the alloc len inline)."""
    extra_context_len_fn: Optional[str]
    """Dotted path of the req_to_token row headroom past the context length; None where the row
    is sized inline (``row_sizing_site``)."""
    alloc_page_size_fn: Optional[str]
    """Dotted path of the allocator page (server page x DCP size) the sizing functions round to;
    None where they round to the server page."""
    sizing_args: SizingArgs
    """How the sizing functions (and ``reserved_tokens_fn``) get the configuration."""
    reserved_tokens_fn: Optional[str]
    """Dotted path of the admission reserve per request (``compute_num_reserved_tokens``); None
    where ``TokenizerManager.__init__`` computes ``num_reserved_tokens`` inline."""
    row_sizing_site: str
    """Where the req_to_token row width is decided (``path.py:function`` inside ``sglang/srt``)."""

    watermark: WatermarkSite
    """How the decode watermark is computed."""
    watermark_function: str
    """Dotted path of the function that computes the watermark."""
    watermark_callers: tuple[str, ...]
    """Dotted paths of the spec-decode functions that call ``watermark_function`` (itself where the
    watermark is inline)."""

    req_to_token_pool_class: str
    """Dotted path of ``ReqToTokenPool`` (built on the ``meta`` device by the CPU tier with
    ``size``, ``max_context_len``, ``device``, ``enable_memory_saver``)."""
    paged_allocator_module: str
    """Module holding ``PagedTokenToKVPoolAllocator`` and ``alloc_extend_naive``."""
    token_allocator_class: str
    """Dotted path of the page-1 ``TokenToKVPoolAllocator``."""
    num_new_pages_fn: str
    """Dotted path of ``get_num_new_pages`` (the paged allocator's page count per extend)."""
    kv_cache_configurator_class: Optional[str]
    """Dotted path of ``KVCacheConfigurator`` (pool construction); None before it exists."""
    draft_pool_page_size_property: bool
    """Whether ``KVCacheConfigurator.pool_page_size`` is a property reading
    ``kv_cache_configurator.get_schedule().page_size`` (what the draft-page-mismatch fault swaps)."""

    server_args_fields: ServerArgsFields
    """How ``ServerArgs``'s field names are listed."""
    renamed_args: dict[str, str]
    """Engine arguments specwatch passes under one name -> this release's name for the setting."""
    absent_args: frozenset[str]
    """Engine arguments specwatch may pass that this release's ``ServerArgs`` lacks (under any
    name)."""
    arg_validation_files: tuple[str, ...]
    """Files (under ``sglang/``) whose checks refuse an engine's arguments before it starts."""
    page_tree_spec_backends_site: Optional[str]
    """``path.py:function`` whose ``_PAGE_TREE_SPEC_BACKENDS`` lists the backends that allow
    topk > 1 on paged KV; None where the release has no such list."""

    leak_counters_on: str
    """Object holding ``count_memory_leak_warnings`` / ``count_req_pool_leak_warnings``:
    ``invariant_checker`` (the scheduler's ``invariant_checker`` attribute) or ``scheduler``."""
    scheduler_startup_time: bool
    """Whether the scheduler keeps ``startup_time`` and ``scheduler_startup_begin``."""

    faults: dict[str, FaultSite]
    """Each source-patcher fault that has an edit in this range, by fault name (draft-page-mismatch
    is a property swap, not a source edit: ``draft_pool_page_size_property``)."""
    dflash_faults: dict[str, FaultSite] = {}
    """Each fault's edit of DFLASH's own code, where DFLASH has a function of its own for what the
    fault breaks (its verify's accepted lengths); the plan carries it beside ``faults``'s."""
    faults_absent: dict[str, str]
    """Each source-patcher fault without an edit in this range, by name -> why."""
