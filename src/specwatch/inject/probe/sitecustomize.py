"""specwatch probe: loaded by every Python process SGLang starts (this folder is on PYTHONPATH).

It patches nothing on disk. After ``sglang.srt.managers.scheduler`` is imported it wraps
``Scheduler.get_internal_state`` so that ``Engine.get_server_info()["internal_states"][i]
["specwatch"]`` carries facts read from the real objects in the scheduler process: the
req_to_token tensor, the token-to-KV allocator, the target and draft KV pools, the tree cache,
and CUDA memory. ``SPECWATCH_FAULT_PLAN`` (a ``specwatch.inject.faults.FaultPlan`` the worker makes
for the installed release) applies a specwatch fault the same way. ``on_import`` is the one hook
mechanism; set SPECWATCH_PROBE=0 to disable. The facts themselves are read by
``specwatch_probe_facts`` (beside this file, dependency-free like it).
"""

import gc
import importlib.abc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the facts module beside this file
from specwatch_probe_facts import (  # noqa: E402, F401  (re-exported: the probe's facts by their old names)
    _PROCESS_T0,
    NEAR_FULL,
    scheduler_facts,
    startup_facts,
    token_usage,
    unrecorded_tail,
)

sys.path.pop(0)
_HOOKS = {}


def on_import(module_name):
    def register(fn):
        _HOOKS.setdefault(module_name, []).append(fn)
        return fn

    return register


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            for hook in _HOOKS.get(name, []):
                try:
                    hook(module)
                except Exception as e:  # a probe must never break SGLang
                    sys.stderr.write(f"[specwatch probe] hook on {name} failed: {e!r}\n")

        loader.exec_module = exec_module
        return spec


_RETRACTED = [0]
"""Requests SGLang retracted from decode batches (KV pool too full for the next step) since the
last read: each one goes back to the queue and is prefilled again later, so a near-full batch that
loses one runs that request alone afterwards, far below full."""


_GC = {"collections": [0, 0, 0], "pause_s": 0.0, "max_pause_s": 0.0, "_t0": None}
"""This process's garbage-collector pauses since the last read, per generation collected: a
collection in the scheduler stalls its launch loop (a tiny oracle's decode is launch-bound)."""


def _gc_pause(phase, info):
    if phase == "start":
        _GC["_t0"] = time.perf_counter()
    elif _GC["_t0"] is not None:
        pause = time.perf_counter() - _GC["_t0"]
        _GC["collections"][min(int(info.get("generation", 0)), 2)] += 1
        _GC["pause_s"] += pause
        _GC["max_pause_s"] = max(_GC["max_pause_s"], pause)
        _GC["_t0"] = None


def _read_gc() -> dict:
    """The pauses since the last read (then reset)."""
    out = {"collections": list(_GC["collections"]), "pause_s": round(_GC["pause_s"], 6)}
    out["max_pause_s"] = round(_GC["max_pause_s"], 6)
    _GC.update(collections=[0, 0, 0], pause_s=0.0, max_pause_s=0.0)
    return out


def _new_occupancy() -> dict:
    return {
        "batches": 0,
        "near_full": 0,
        "peak": 0.0,
        "decode_batches": 0,
        "decode_near_full": 0,
        "decode_peak": 0.0,
        "decode_peak_requests": 0,
        "max_decode_requests": 0,
        "decode_waiting_max": 0,
        "decode_unrecorded_tail_max": 0,
        "decode_unaligned_batches": 0,
        "probe_s": 0.0,
    }


def _patch_run_batch(cls):
    """Sample token usage before every batch the scheduler runs; read and reset by
    get_internal_state, so each case's facts cover the batches since the last read. Decode
    batches also note how many requests ran: the usage per request at the decode peak is what
    near-full's calibration sizes prompts by (``engine_worker.near_full_extension``)."""
    original = cls.run_batch

    def run_batch(self, batch, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            u = token_usage(self)
            occ = self.__dict__.get("_specwatch_occupancy")
            if occ is None:
                occ = self.__dict__["_specwatch_occupancy"] = _new_occupancy()
            occ["batches"] += 1
            occ["near_full"] += u > NEAR_FULL
            occ["peak"] = max(occ["peak"], u)
            mode = getattr(batch, "forward_mode", None)
            if mode is not None and mode.is_decode():  # decode steps: where near-full must hold
                n = len(getattr(batch, "reqs", ()) or ())
                occ["decode_waiting_max"] = max(
                    occ["decode_waiting_max"], len(getattr(self, "waiting_queue", ()) or ())
                )
                occ["decode_batches"] += 1
                occ["decode_near_full"] += u > NEAR_FULL
                occ["max_decode_requests"] = max(occ["max_decode_requests"], n)
                if u > occ["decode_peak"]:
                    occ["decode_peak"], occ["decode_peak_requests"] = u, n
            occ["probe_s"] += time.perf_counter() - t0  # the probe's own cost on the batch's path
        except Exception:
            pass
        ret = original(self, batch, *args, **kwargs)
        try:  # after the step: its decode watermark is allocated and recorded by now
            mode = getattr(batch, "forward_mode", None)
            if mode is not None and mode.is_decode():
                t0 = time.perf_counter()
                occ = self.__dict__["_specwatch_occupancy"]
                tail = unrecorded_tail(self, batch)
                occ["decode_unrecorded_tail_max"] = max(occ["decode_unrecorded_tail_max"], tail)
                occ["decode_unaligned_batches"] += tail > 0
                occ["probe_s"] += time.perf_counter() - t0
        except Exception:
            pass
        return ret

    cls.run_batch = run_batch


@on_import("sglang.srt.managers.schedule_batch")
def _patch_retract(module):
    cls = module.ScheduleBatch
    original = cls.retract_decode

    def retract_decode(self, *args, **kwargs):
        ret = original(self, *args, **kwargs)
        try:
            _RETRACTED[0] += len(ret[0])  # (retracted_reqs, new_token_ratio, ...)
        except Exception:
            pass
        return ret

    cls.retract_decode = retract_decode


@on_import("sglang.srt.managers.scheduler")
def _patch_scheduler(module):
    cls = module.Scheduler
    if hasattr(cls, "run_batch"):
        _patch_run_batch(cls)
    if _gc_pause not in gc.callbacks:
        gc.callbacks.append(_gc_pause)
    original = cls.get_internal_state

    def get_internal_state(self, recv_req):
        ret = original(self, recv_req)
        try:
            # 0.5.17 wraps the dict in GetInternalStateReqOutput(internal_state=...); older return it bare
            state = getattr(ret, "internal_state", ret)
            try:
                state["specwatch"] = scheduler_facts(self)
                fault = os.environ.get("SPECWATCH_FAULT")
                fm = sys.modules.get("specwatch.inject.faults")
                if fault and fm is not None:
                    # how often the fault's edited code has run in this engine so far: a total, since
                    # some edits (sizing) run once at start-up and every later case lives with them
                    state["specwatch"]["fault_code_runs"] = fm.HITS.get(fault, 0)
                occ = self.__dict__.pop("_specwatch_occupancy", None)
                if occ is not None:
                    occ["retracted_requests"] = _RETRACTED[0]
                _RETRACTED[0] = 0
                state["specwatch"]["occupancy"] = occ
                state["specwatch"]["gc"] = _read_gc()
            except Exception as e:
                state["specwatch"] = {"error": repr(e)}
        except Exception as e:
            sys.stderr.write(f"[specwatch probe] cannot attach facts: {e!r}\n")
        return ret

    cls.get_internal_state = get_internal_state


def _register_fault(plan_json):
    """Apply the planned specwatch fault (``specwatch.inject.faults.FaultPlan``, made by the worker
    for the installed SGLang release) in this process: each edit when its module loads."""
    from specwatch.inject.faults import FaultPlan, apply

    plan = FaultPlan.from_json(plan_json)

    def hook(module):
        apply(plan, module.__name__)
        sys.stderr.write(f"[specwatch probe] fault {plan.name} applied to {module.__name__} in pid {os.getpid()}\n")

    for mod in dict.fromkeys(plan.modules):
        if mod in sys.modules:  # imported before the plan was made (the worker's own process)
            hook(sys.modules[mod])
        else:
            on_import(mod)(hook)


if os.environ.get("SPECWATCH_PROBE", "1") == "1":
    sys.meta_path.insert(0, _PostImportFinder())
    if os.environ.get("SPECWATCH_FAULT_PLAN"):
        _register_fault(os.environ["SPECWATCH_FAULT_PLAN"])
