"""Noise classes: the cases whose timings share a noise level, and so a detection floor."""

from __future__ import annotations


def noise_class(case, turns: bool = False) -> str:
    """Cases whose timings share a noise level: model and batch size (a tiny model at batch 1 is
    bound by the CPU scheduler and far noisier between runs than an 8b model at batch 8); the
    model by ``Case.model_label``, so each own model is a class of its own, by its name. ``turns``:
    two passes that took turns (``CaseRecord.paired_turns``), a class of its own (``PAIRED_SUFFIX``)."""
    return f"{case.model_label}/bs{case.batch_size}{PAIRED_SUFFIX if turns else ''}"


PAIRED_SUFFIX = "+paired"
"""Appended to the noise class of two passes that took turns batch by batch (``specwatch run
--paired``): their change is the geometric mean of round ratios timed within a second of each
other, whose noise is not the serpentine rounds' (tens of seconds apart), so their A/A pairs set a
floor of their own, and it is not scaled to the window spread (the host's slow state moves both
sides of a round alike)."""
