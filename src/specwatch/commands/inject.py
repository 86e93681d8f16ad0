"""``specwatch inject`` and ``specwatch overlay``: the faults specwatch can put into SGLang, and a commit
of SGLang's own code to run in place of the installed one."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specwatch.commands.output import console, print_table
from specwatch.core.errors import SpecwatchInputError


def overlay_cmd(
    repo: Path = typer.Argument(..., help="A local git repository of SGLang."),
    rev: str = typer.Argument(..., help="Commit, tag or branch to export."),
    out: Path = typer.Option(Path(".overlay"), help="Where overlays are written (git-ignored)."),
    force: bool = typer.Option(False, help="Allow a commit of another release line than the installed SGLang."),
) -> None:
    """Export SGLang's python/sglang at REV as a commit overlay for `specwatch run --overlay`."""
    from specwatch.core.sglang_host import sglang_version
    from specwatch.inject.overlay import build

    ov = build(repo, rev, out, sglang_version(), force=force)
    console.print(
        f"overlay {ov.root}: commit {ov.commit}, code version {ov.code_version}, recorded as {ov.recorded_version}"
    )


def inject(name: Optional[str] = typer.Argument(None, help="Fault to check against the installed SGLang.")) -> None:
    """List the injectable faults; with NAME, apply and restore it here to check it fits this SGLang.
    Use ``specwatch run SUITE --fault NAME`` to run a sweep with the fault active in SGLang's processes."""
    from specwatch.inject import faults

    if name is None:
        print_table(
            "faults (specwatch run SUITE --fault NAME)",
            ["name", "re-creates", "expected to be flagged by"],
            [[f.name, f.recreates, f.expected_flag] for f in faults.FAULTS.values()],
        )
        return
    from specwatch.core.sglang_host import _quiet_import
    from specwatch.rules.releases import fault_plan

    try:
        plan = fault_plan(name)
        for module in plan.modules:
            try:
                _quiet_import(module)
            except ModuleNotFoundError as e:
                if (e.name or "").startswith("sglang"):
                    raise
                console.print(f"{name}: {module} needs {e.name} (not installed here): its edit not checked")
                continue
            with faults.applied(plan, module):
                pass
    except ImportError as e:
        raise SpecwatchInputError(
            None, f"sglang is not importable here ({e}): a fault is checked against the installed SGLang", field=name
        ) from None
    except ValueError as e:
        raise SpecwatchInputError(None, str(e), field=name) from None
    console.print(f"{name}: applies to the installed SGLang and restores cleanly")
