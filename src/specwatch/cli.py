"""The ``specwatch`` command line: the typer app, its commands (each in ``specwatch.commands``) and
the console script.

Bad input anywhere below raises ``SpecwatchInputError``; ``main`` (the console script) prints it as
one line and exits 2, as it does for an OSError and for typer's own usage errors.
"""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from rich.text import Text

from specwatch.commands import changepoints, inject, noise, plan, run, store
from specwatch.commands.model import model_app
from specwatch.commands.output import console, err_console, width_for
from specwatch.core.errors import SpecwatchInputError

try:  # typer vendors its own click; click's exception classes are not its
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover (typer on the click package)
    from click.exceptions import ClickException, NoArgsIsHelpError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Benchmark and regression tracking for SGLang speculative decoding.",
)


def main(argv: Optional[list[str]] = None) -> None:
    """The console script: run the app and turn bad input into one line on stderr, exit 2."""
    try:
        code = app(args=argv, prog_name="specwatch", standalone_mode=False)
    except NoArgsIsHelpError as e:
        e.show()
        code = 2
    except ClickException as e:
        where = f"{e.ctx.command_path}: " if getattr(e, "ctx", None) else ""
        code = _error(where + e.format_message(), e.exit_code)
    except typer.Abort:
        code = _error("aborted", 1)
    except SpecwatchInputError as e:
        code = _error(str(e), 2)
    except OSError as e:
        code = _error(f"{e.filename}: {e.strerror}" if e.filename else str(e), 2)
    sys.exit(code if isinstance(code, int) else 0)


def _error(message: str, code: int) -> int:
    err_console.print(Text.assemble(("error:", "red"), " ", " ".join(message.split())), soft_wrap=True)
    return code


def _version(value: bool) -> None:
    if value:
        from specwatch import __version__
        from specwatch.core.sglang_host import sglang_version

        sglang = sglang_version()
        print(f"specwatch {__version__}, " + (f"SGLang {sglang}" if sglang else "SGLang not installed"))
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print specwatch's and the installed SGLang's versions."
        ),
    ] = False,
) -> None:
    """Benchmark and regression tracking for SGLang speculative decoding."""
    console.width, err_console.width = width_for(), width_for(stderr=True)  # as the invocation's environment says


# the commands, in the order --help lists them
for name, command in (
    ("plan", plan.plan),
    ("run", run.run),
    ("overlay", inject.overlay_cmd),
    ("import", store.import_cmd),
    ("inject", inject.inject),
    ("compare", noise.compare),
    ("noise", noise.noise),
    ("noise-holdout", noise.noise_holdout),
    ("dashboard", store.dashboard),
    ("overhead", store.overhead),
    ("asv-import", store.asv_import_cmd),
    ("results", store.results_cmd),
    ("roofline", store.roofline_cmd),
    ("changepoints", changepoints.changepoints),
):
    app.command(name)(command)
app.add_typer(model_app, name="model")


if __name__ == "__main__":  # pragma: no cover
    main()
