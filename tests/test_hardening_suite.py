"""The hardening harness's suite-level classes (bad suite files, bad ``--where`` values) against the CLI:
all handled.

The harness runs each trial as ``python -m specwatch.cli`` in a subprocess. Here its own
``run_trial`` (files, set-up, the judge, the check for files written outside the targets) runs each
trial with the CLI's console script, ``specwatch.cli.main``, called in this interpreter instead: an
interpreter start and specwatch's imports cost more than the trial itself, over 100 trials.
``test_the_real_cli_prints_one_line_and_exits_2_on_a_bad_suite_file`` runs one trial through the real
subprocess, so the console-script path the in-process runs stand in for is checked too.
"""

import contextlib
import importlib.util
import io
import os
import subprocess
import sys
import traceback
from types import SimpleNamespace

from conftest import ROOT

spec = importlib.util.spec_from_file_location("hardening", ROOT / "scripts" / "hardening.py")
hardening = sys.modules["hardening"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hardening)


def _cli_in_process(cmd, *, cwd, env, timeout=None, **_):
    """``subprocess.run`` for ``python -m specwatch.cli ARGS``: ``specwatch.cli.main(ARGS)`` in this
    interpreter, in the trial's folder and environment, its exit code, stdout and stderr captured (an
    exception that escapes ``main`` is printed as the traceback an interpreter would print)."""
    from specwatch import cli

    assert cmd[1:3] == ["-m", "specwatch.cli"], cmd
    out, err, code = io.StringIO(), io.StringIO(), 0
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main(list(cmd[3:]))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 (the harness's judge reads it as a traceback)
        err.write(traceback.format_exc())
        code = 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(cmd, code, out.getvalue(), err.getvalue())


def _run_in_process(only, tmp_path, monkeypatch):
    """The harness's trials whose class starts with ``only``, each run by ``hardening.run_trial`` with
    the CLI called in this interpreter; their outcomes, in trial order."""
    trials = hardening.all_trials(only)
    assert not any(t.unprivileged for t in trials)  # those need a process of their own
    real = subprocess.run
    fake = SimpleNamespace(
        run=lambda cmd, **kw: _cli_in_process(cmd, **kw) if cmd[1:3] == ["-m", "specwatch.cli"] else real(cmd, **kw),
        TimeoutExpired=subprocess.TimeoutExpired,
    )
    monkeypatch.setattr(hardening, "subprocess", fake)
    # typer builds the same click command tree from the app on every call, most of an in-process
    # trial's time: built once here
    import typer.main

    from specwatch import cli

    build, built = typer.main.get_command, typer.main.get_command(cli.app)
    monkeypatch.setattr(typer.main, "get_command", lambda app: built if app is cli.app else build(app))
    return trials, [
        hardening.run_trial(t, hardening._mk(tmp_path, f"{i:03d}"), sys.executable) for i, t in enumerate(trials)
    ]


def test_every_bad_suite_file_gets_one_line_naming_file_and_field_and_exit_2(tmp_path, monkeypatch):
    trials, outcomes = _run_in_process("suite:", tmp_path, monkeypatch)
    assert len(trials) >= 114 and len(outcomes) == len(trials)
    bad = [f"{o.klass} / {o.variant}: {o.why}" for o in outcomes if not o.handled]
    assert not bad, "\n".join(bad)


def test_bad_where_values_are_refused_by_the_cli(tmp_path, monkeypatch):
    _, outcomes = _run_in_process("option: --where", tmp_path, monkeypatch)
    bad = [f"{o.variant}: {o.why}" for o in outcomes if not o.handled]
    assert len(outcomes) >= 8 and not bad, "\n".join(bad)


def test_the_real_cli_prints_one_line_and_exits_2_on_a_bad_suite_file(tmp_path):
    """One trial per kind of runner through ``python -m specwatch.cli`` in a subprocess, as the
    harness runs it: a bad suite file for ``plan`` and a bad ``--where`` for ``run --cpu-tier``."""
    wanted = {("suite: out of bounds", "page_size = [0]"), ("option: --where", "bogus (run)")}
    trials = [t for t in hardening.all_trials() if (t.klass, t.variant) in wanted]
    assert len(trials) == 2
    for i, t in enumerate(trials):
        o = hardening.run_trial(t, hardening._mk(tmp_path, str(i)), sys.executable)
        assert o.handled, f"{o.klass} / {o.variant}: {o.why}"
        assert "page_size" in o.why or "--where" in o.why  # the one error line, naming the field


def test_the_in_process_runner_sees_a_traceback_and_a_second_line(tmp_path, monkeypatch):
    """The in-process stand-in must let the judge fail a trial: an exception escaping ``main`` comes
    back as a traceback, and what ``main`` prints is returned as it was printed."""
    from specwatch import cli

    def boom(argv):
        raise KeyError("x")

    monkeypatch.setattr(cli, "main", boom)
    proc = _cli_in_process([sys.executable, "-m", "specwatch.cli", "plan"], cwd=tmp_path, env=dict(os.environ))
    assert proc.returncode == 1 and not hardening.judge(proc.returncode, proc.stdout, proc.stderr, "x")[0]

    def two_lines(argv):
        print("error: s.toml: one\nerror: s.toml: two", file=sys.stderr)
        sys.exit(2)

    monkeypatch.setattr(cli, "main", two_lines)
    proc = _cli_in_process([sys.executable, "-m", "specwatch.cli", "plan"], cwd=tmp_path, env=dict(os.environ))
    assert proc.returncode == 2
    assert hardening.judge(2, proc.stdout, proc.stderr, "s.toml") == (
        False,
        "2 error lines: error: s.toml: one / error: s.toml: two",
    )


def test_the_judge_counts_a_lax_accept_a_traceback_and_a_wrapped_line_as_not_handled():
    assert hardening.judge(2, "", "error: s.toml: matrix[0].page_size[0]: bad\n", "s.toml") == (
        True,
        "error: s.toml: matrix[0].page_size[0]: bad",
    )
    assert not hardening.judge(0, "a table", "", "s.toml")[0]
    assert not hardening.judge(2, "", "Traceback (most recent call last):\n  x\nKeyError: 1\n", "s.toml")[0]
    assert not hardening.judge(2, "", "error: s.toml: a long line\nwrapped here\n", "s.toml")[0]
    assert not hardening.judge(2, "", "error: other.toml: bad\n", "s.toml")[0]
    assert not hardening.judge(2, "", "error: s.toml: bad\n", "s.toml", stray={"escape/x.jsonl"})[0]
