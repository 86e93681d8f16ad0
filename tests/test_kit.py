"""Offline kits, without network: fake wheels in a local folder stand in for the package index."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from specwatch.core.errors import SpecwatchInputError
from specwatch.kit import build_kit
from specwatch.kit.download import PipDownloader, download_error
from specwatch.kit.host import HostProfile
from specwatch.kit.manifest import KitManifest
from specwatch.kit.pack import pieces_of, plan_parts
from specwatch.kit.pins import Resolver
from specwatch.kit.trim import without_fa3
from specwatch.kit.wheels import Wheel

TEST_HOST = HostProfile(
    installed={
        "torch": "2.11.0+cu130",
        "nvidia-cudnn-cu13": "9.19.0.56",
        "filelock": None,
        "transformers": "5.17.0",
    }
)


def make_wheel(folder: Path, name: str, version: str, requires=(), files=None) -> Path:
    """A minimal installable py3-none-any wheel with METADATA listing ``requires``."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = dict(files if files is not None else {f"{dist}/__init__.py": f"__version__ = {version!r}\n"})
    files[f"{info}/METADATA"] = (
        "\n".join(
            [
                "Metadata-Version: 2.1",
                f"Name: {name}",
                f"Version: {version}",
                *[f"Requires-Dist: {r}" for r in requires],
            ]
        )
        + "\n"
    )
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, data in files.items():
        raw = data.encode() if isinstance(data, str) else data
        digest = base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(raw)}")
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)
    return target


def noise(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.fixture
def index(tmp_path, monkeypatch) -> Path:
    """A local find-links folder shaped like two SGLang releases and their dependencies."""
    for var in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    d = tmp_path / "index"
    serving = [
        "fastapi",
        "datasets",
        "diffusers",
        "flashinfer-cubin==0.6.18",
        "ipython",
        "flashinfer_python[cu13]==0.6.18",
        "sgl-deep-gemm==0.2.0",
        "transformers==5.12.1",
    ]
    make_wheel(
        d, "sglang", "0.5.20", ["torch==2.13.0", "sglang-kernel==0.4.7", *serving, 'uvloop; sys_platform == "win32"']
    )
    make_wheel(d, "sglang", "0.5.17", ["torch==2.11.0", "sglang-kernel==0.4.5", *serving])
    make_wheel(
        d,
        "torch",
        "2.13.0",
        [
            "filelock",
            "nvidia-nccl-cu13==2.29.7",
            'triton==3.7.1; platform_system == "Linux"',
            'nvidia-cudnn-cu13==9.19.0.56; platform_system == "Linux"',
        ],
    )
    make_wheel(
        d,
        "nvidia-nccl-cu13",
        "2.29.7",
        files={"nvidia/nccl/lib/libnccl.so.2": noise(150_000, 1), "nvidia/nccl/__init__.py": ""},
    )
    make_wheel(d, "triton", "3.7.1")
    make_wheel(
        d,
        "sglang-kernel",
        "0.4.7",
        ["torch==2.13.0"],
        files={
            "sgl_kernel/__init__.py": "",
            "sgl_kernel/flash_ops.abi3.so": noise(200_000, 2),
            "sgl_kernel/common_ops.abi3.so": noise(20_000, 3),
        },
    )
    make_wheel(d, "sglang-kernel", "0.4.5", ["torch==2.11.0"])
    make_wheel(d, "flashinfer-python", "0.6.18", ["torch", 'nvidia-cutlass-dsl; extra == "cu13"'])
    make_wheel(d, "flashinfer-cubin", "0.6.18")
    make_wheel(d, "transformers", "5.12.1", ["tokenizers<=0.23.0,>=0.22.0"])
    make_wheel(d, "tokenizers", "0.22.2")
    make_wheel(d, "tokenizers", "0.24.0")
    make_wheel(d, "fastapi", "0.165.0", ["starlette>=1.0", "pydantic"])
    make_wheel(d, "starlette", "0.9.0")
    make_wheel(d, "starlette", "1.10.0")
    make_wheel(d, "pydantic", "2.14.4", ["typing-extensions>=4.0"])
    # typing-extensions: pydantic takes the newest, sgl-deep-gemm then needs an older one
    make_wheel(d, "typing-extensions", "5.0.0")
    make_wheel(d, "typing-extensions", "4.16.0")
    make_wheel(d, "sgl-deep-gemm", "0.2.0", ["typing-extensions<5"])
    make_wheel(
        d,
        "ipython",
        "9.18.1",
        files={"IPython/__init__.py": "", "ipy_extra.pth": "ipy_extra\n", "ipy_extra/ipy_mod.py": "X = 1\n"},
    )
    make_wheel(d, "datasets", "4.0.0")
    make_wheel(d, "diffusers", "0.36.0")
    make_wheel(d, "dill", "0.4.1")  # not in SGLang's METADATA: carried by a release rule
    make_wheel(d, "jsonschema", "4.26.0")  # likewise
    return d


def downloader(index: Path, tmp_path: Path, host=TEST_HOST) -> PipDownloader:
    return PipDownloader(
        host, cache=tmp_path / "cache", index_args=("--no-index", "--find-links", str(index)), log=lambda line: None
    )


def resolve(index, tmp_path, version, **kw):
    return Resolver(downloader(index, tmp_path), TEST_HOST, log=lambda line: None, **kw).resolve(version)


def pinned(resolution) -> dict[str, str]:
    return {p.name: str(p.version) for p in resolution.sorted_pins()}


def test_pins_follow_requires_dist_and_carry_torch_only_where_the_host_differs(index, tmp_path):
    r = resolve(index, tmp_path, "0.5.20")
    assert pinned(r) == {
        "sglang": "0.5.20",
        "torch": "2.13.0",
        "nvidia-nccl-cu13": "2.29.7",
        "triton": "3.7.1",
        "sglang-kernel": "0.4.7",
        "flashinfer-python": "0.6.18",
        "transformers": "5.12.1",
        "tokenizers": "0.22.2",
        "fastapi": "0.165.0",
        "starlette": "1.10.0",
        "pydantic": "2.14.4",
        "typing-extensions": "4.16.0",
        "sgl-deep-gemm": "0.2.0",
        "ipython": "9.18.1",
        "dill": "0.4.1",
        "jsonschema": "4.26.0",
        "datasets": "4.0.0",
    }
    # the host's cuDNN satisfies torch's pin; filelock is the host's; diffusers is off the serving path
    assert "diffusers" not in r.pins
    assert r.host_served["nvidia-cudnn-cu13"] == "nvidia-cudnn-cu13==9.19.0.56"
    assert "filelock" in r.host_served
    assert "flashinfer-cubin" in r.omitted
    assert r.pins["torch"].required_by == "sglang==0.5.20"
    assert r.pins["nvidia-nccl-cu13"].required_by == "torch==2.13.0"


def test_release_whose_torch_pin_the_host_serves_carries_no_torch(index, tmp_path):
    r = resolve(index, tmp_path, "0.5.17")
    names = set(pinned(r))
    assert not names & {"torch", "triton", "nvidia-nccl-cu13"}
    assert r.host_served["torch"] == "torch==2.11.0"
    assert pinned(r)["sglang-kernel"] == "0.4.5"


def test_cubin_on_request(index, tmp_path):
    r = resolve(index, tmp_path, "0.5.20", cubin=True)
    assert pinned(r)["flashinfer-cubin"] == "0.6.18"
    assert "flashinfer-cubin" not in r.omitted


def test_host_profile_serves_ranges_but_not_exact_pins_for_unknown_versions():
    host = HostProfile(installed={"numpy": None, "torch": "2.11.0+cu130"})
    assert host.serves(Requirement("numpy>=1.20"))
    assert not host.serves(Requirement("numpy==2.0.0"))
    assert host.serves(Requirement("torch==2.11.0"))
    assert not host.serves(Requirement("torch==2.13.0"))
    assert not host.serves(Requirement("tokenizers"))


def test_host_profile_from_pip_list(tmp_path):
    path = tmp_path / "host.json"
    path.write_text(json.dumps([{"name": "Torch", "version": "2.13.0"}]))
    host = HostProfile.from_json(path)
    assert host.installed == {"torch": "2.13.0"}
    path.write_text("{nope")
    with pytest.raises(SpecwatchInputError, match="cannot read host profile"):
        HostProfile.from_json(path)


def test_pieces_fit_and_reassemble_byte_identical(tmp_path):
    blob = tmp_path / "big-1.0-py3-none-any.whl"
    blob.write_bytes(noise(1_000_003, 4))
    pieces = pieces_of(blob, 300_000)
    assert [p.length for p in pieces] == [300_000, 300_000, 300_000, 100_003]
    small = tmp_path / "small-1.0-py3-none-any.whl"
    small.write_bytes(noise(150_000, 5))
    parts = plan_parts(pieces + pieces_of(small, 300_000), 300_000)
    assert all(sum(p.length for p in part) <= 300_000 for part in parts)
    assert len(parts) == 4  # the 100_003-byte tail and the small wheel share a part
    joined = b""
    with open(blob, "rb") as f:
        data = f.read()
    for piece in pieces:
        joined += data[piece.offset : piece.offset + piece.length]
    assert joined == data


def build(index, tmp_path, version="0.5.20", name=None, **kw) -> tuple[Path, KitManifest]:
    out = tmp_path / (name or f"kit-{version}")
    manifest = build_kit(
        version,
        out,
        host=TEST_HOST,
        downloader=downloader(index, tmp_path),
        cache=tmp_path / "cache",
        log=lambda line: None,
        **kw,
    )
    return out, manifest


def test_build_writes_parts_under_the_limit_with_checksums(index, tmp_path):
    limit = 160 * 1024
    out, manifest = build(index, tmp_path, part_limit=limit)
    assert manifest.carries_torch and manifest.sglang_version == "0.5.20"
    assert len(manifest.parts) >= 3
    for part in manifest.parts:
        folder = out / part.name
        assert sum(f.stat().st_size for f in folder.iterdir()) <= limit
        assert (folder / "install.sh").is_file()
        assert KitManifest.read(folder / "manifest.json") == manifest
    nccl = next(w for w in manifest.wheels if w.name == "nvidia-nccl-cu13")
    assert len(nccl.chunks) >= 2  # split: larger than a part
    files = {f.name: (out / p.name / f.name) for p in manifest.parts for f in p.files}
    data = b"".join(files[c].read_bytes() for c in nccl.chunks)
    assert hashlib.sha256(data).hexdigest() == nccl.sha256
    for part in manifest.parts:
        for f in part.files:
            assert hashlib.sha256(files[f.name].read_bytes()).hexdigest() == f.sha256


def test_fa3_left_out_on_request(index, tmp_path):
    kernel = Wheel(index / "sglang_kernel-0.4.7-py3-none-any.whl")
    trimmed = without_fa3(kernel, tmp_path / "trim")
    with zipfile.ZipFile(trimmed.path) as z:
        names = z.namelist()
        record = z.read("sglang_kernel-0.4.7.dist-info/RECORD").decode()
    assert "sgl_kernel/flash_ops.abi3.so" not in names and "flash_ops" not in record
    assert "sgl_kernel/common_ops.abi3.so" in names
    _, manifest = build(index, tmp_path, fa3=False)
    kernel_entry = next(w for w in manifest.wheels if w.name == "sglang-kernel")
    assert not manifest.fa3 and kernel_entry.size < kernel.path.stat().st_size


def run_install(part: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(part / "install.sh")], env=env, capture_output=True, text=True)


def install_env(tmp_path: Path) -> dict:
    return {
        **os.environ,
        "SPECWATCH_SITE": str(tmp_path / "site"),
        "SPECWATCH_KIT_STASH": str(tmp_path / "stash"),
        "SPECWATCH_KIT_PYTHON": sys.executable,
    }


def copy_part(out: Path, name: str, call: Path) -> Path:
    """One part folder alone in a fresh folder, as one copy to the host brings it."""
    target = call / "kit" / name
    shutil.copytree(out / name, target)
    return target


def test_install_part_by_part_then_import(index, tmp_path):
    out, manifest = build(index, tmp_path, part_limit=160 * 1024)
    env = install_env(tmp_path)
    names = [p.name for p in manifest.parts]
    for i, name in enumerate(names):
        run = run_install(copy_part(out, name, tmp_path / f"call-{i}"), env)
        assert run.returncode == 0, run.stdout + run.stderr
        if i < len(names) - 1:
            assert "still to come" in run.stdout and not (tmp_path / "site" / "env.sh").exists()
    assert "installed in" in run.stdout
    site = tmp_path / "site"
    env_sh = (site / "env.sh").read_text()
    assert f"PYTHONPATH={site}:{site / 'ipy_extra'}" in env_sh
    assert "HF_HUB_OFFLINE=1" in env_sh and "NCCL_NVLS_ENABLE=0" in env_sh
    assert str(site / "nvidia" / "nccl" / "lib") in env_sh
    check = subprocess.run(
        [
            "bash",
            "-c",
            f"source {site}/env.sh && {sys.executable} -c "
            "'import sglang, torch, ipy_mod; print(sglang.__version__, torch.__version__)'",
        ],
        capture_output=True,
        text=True,
    )
    assert check.stdout.split() == ["0.5.20", "2.13.0"], check.stderr
    again = run_install(out / names[0], env)
    assert "already installed" in again.stdout


def test_install_all_parts_at_once(index, tmp_path):
    out, _ = build(index, tmp_path, "0.5.17", part_limit=160 * 1024)
    run = run_install(out / "part-00", install_env(tmp_path))
    assert run.returncode == 0 and "installed in" in run.stdout, run.stdout + run.stderr
    assert (tmp_path / "site" / "sglang" / "__init__.py").is_file()
    assert "LD_LIBRARY_PATH" not in (tmp_path / "site" / "env.sh").read_text()


def test_install_detects_a_corrupt_part_and_recovers_when_it_is_copied_again(index, tmp_path):
    out, manifest = build(index, tmp_path, part_limit=160 * 1024)
    env = install_env(tmp_path)
    first, *rest = [p.name for p in manifest.parts]
    bad = copy_part(out, first, tmp_path / "bad")
    victim = bad / manifest.parts[0].files[0].name
    victim.write_bytes(b"x" + victim.read_bytes()[1:])
    assert run_install(bad, env).returncode == 0  # stashed; the kit is not complete yet
    for i, name in enumerate(rest):
        run = run_install(copy_part(out, name, tmp_path / f"call-{i}"), env)
    assert run.returncode == 1 and f"checksum mismatch in {first}" in run.stdout
    assert not (tmp_path / "site" / ".specwatch-kit").exists()
    run = run_install(copy_part(out, first, tmp_path / "again"), env)
    assert run.returncode == 0 and "installed in" in run.stdout, run.stdout + run.stderr


def cli(*args, env=None) -> subprocess.CompletedProcess:
    src = Path(__file__).resolve().parents[1] / "src"
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": str(src)}
    return subprocess.run([sys.executable, "-m", "specwatch.kit", *args], env=full_env, capture_output=True, text=True)


def test_unknown_version_is_one_line_and_exit_2(index, tmp_path):
    run = cli(
        "build",
        "0.5.99",
        "--out",
        str(tmp_path / "k"),
        "--cache",
        str(tmp_path / "c"),
        env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index)},
    )
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "Traceback" not in run.stderr
    assert "sglang==0.5.99" in run.stderr
    run = cli("build", "five", "--out", str(tmp_path / "k"))
    assert run.returncode == 2 and "is not a version" in run.stderr and "Traceback" not in run.stderr


def test_no_network_is_one_line_and_exit_2(tmp_path):
    # an index on a closed loopback port: pip's connection is refused
    run = cli(
        "build",
        "0.5.20",
        "--out",
        str(tmp_path / "k"),
        "--cache",
        str(tmp_path / "c"),
        env={
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
            "PIP_FIND_LINKS": "",
            "PIP_RETRIES": "0",
            "PIP_TIMEOUT": "2",
        },
    )
    assert run.returncode == 2, run.stderr
    assert "cannot reach the package index" in run.stderr and "Traceback" not in run.stderr


def test_download_error_names_the_missing_wheel():
    e = download_error("ERROR: No matching distribution found for sglang==9.9\n", ["sglang==9.9"])
    assert "no wheel of sglang==9.9" in str(e)


def test_out_folder_with_other_files_is_refused(index, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SpecwatchInputError, match="not empty"):
        build_kit("0.5.20", out, host=TEST_HOST, downloader=downloader(index, tmp_path), log=lambda l: None)


def test_a_distribution_omitted_at_build_time_is_left_out_and_says_why(index, tmp_path):
    r = resolve(index, tmp_path, "0.5.20", omit={"NVIDIA_NCCL_cu13": "the host's serves"})
    assert "nvidia-nccl-cu13" not in r.pins and r.omitted["nvidia-nccl-cu13"] == "the host's serves"
    assert "torch" in r.pins


def test_layered_kit_carries_only_what_its_base_lacks_and_imports_through_the_base(index, tmp_path):
    make_wheel(index, "sglang", "0.5.21", ["torch==2.13.0", "sglang-kernel==0.4.7", "transformers==5.12.1"])
    base_out, base = build(index, tmp_path, "0.5.20")
    layer_out, layer = build(index, tmp_path, "0.5.21", base=base_out)
    assert [w.name for w in layer.wheels] == ["sglang"]
    assert layer.base.kit_id == base.kit_id and layer.base.wheels >= 5 and not layer.carries_torch
    env = {**install_env(tmp_path), "SPECWATCH_SITE": str(tmp_path / "site-21")}
    refused = run_install(layer_out / "part-00", {**env, "SPECWATCH_BASE_SITE": str(tmp_path / "site-20")})
    assert refused.returncode == 2 and "install that kit first" in refused.stdout
    for part in base.parts:
        assert run_install(base_out / part.name, {**env, "SPECWATCH_SITE": str(tmp_path / "site-20")}).returncode == 0
    done = run_install(layer_out / "part-00", {**env, "SPECWATCH_BASE_SITE": str(tmp_path / "site-20")})
    assert done.returncode == 0 and "installed in" in done.stdout, done.stdout + done.stderr
    check = subprocess.run(
        [
            "bash",
            "-c",
            f"source {tmp_path / 'site-21'}/env.sh && {sys.executable} -c "
            "'import importlib.metadata as m, sglang, torch; print(sglang.__version__, m.version(\"sglang\"), torch.__version__)'",
        ],
        capture_output=True,
        text=True,
    )
    assert check.stdout.split() == ["0.5.21", "0.5.21", "2.13.0"], check.stderr


def test_a_base_that_is_not_a_kit_is_one_line_and_exit_2(index, tmp_path):
    (tmp_path / "nokit").mkdir()
    run = cli("build", "0.5.20", "--out", str(tmp_path / "out"), "--base", str(tmp_path / "nokit"))
    assert run.returncode == 2 and "--base" in run.stderr and "Traceback" not in run.stderr


def test_a_with_requirement_is_carried_and_a_layer_on_the_same_release_holds_only_it(index, tmp_path):
    make_wheel(index, "ray", "2.60.0", ["filelock", "msgpack<2"])
    make_wheel(index, "msgpack", "1.1.0")
    base_out, _ = build(index, tmp_path, "0.5.20")
    _, layer = build(index, tmp_path, "0.5.20", name="ray-layer", base=base_out, extra=["ray==2.60.0"])
    assert sorted(w.name for w in layer.wheels) == ["msgpack", "ray"]
    assert {w.name: w.required_by for w in layer.wheels}["ray"] == "--with"


def test_a_layer_leaves_out_what_its_base_left_to_the_host(index, tmp_path):
    make_wheel(index, "ray", "2.60.0", ["filelock", "msgpack<2"])
    make_wheel(index, "msgpack", "1.1.0")
    omit = {"nvidia-nccl-cu13": "the host's serves"}
    base_out, base = build(index, tmp_path, "0.5.20", omit=omit)
    assert "nvidia-nccl-cu13" in base.omitted
    _, layer = build(index, tmp_path, "0.5.20", name="ray-layer", base=base_out, extra=["ray==2.60.0"])
    assert sorted(w.name for w in layer.wheels) == ["msgpack", "ray"]
    assert layer.omitted["nvidia-nccl-cu13"] == "the host's serves"


def test_a_layer_on_a_kit_without_fa3_leaves_the_trimmed_kernel_to_its_base(index, tmp_path):
    make_wheel(index, "ray", "2.60.0", ["filelock", "msgpack<2"])
    make_wheel(index, "msgpack", "1.1.0")
    base_out, base = build(index, tmp_path, "0.5.20", fa3=False)
    assert not base.fa3
    _, layer = build(index, tmp_path, "0.5.20", name="ray-layer", base=base_out, extra=["ray==2.60.0"])
    assert not layer.fa3 and sorted(w.name for w in layer.wheels) == ["msgpack", "ray"]


def test_a_with_that_is_not_a_requirement_is_one_line_and_exit_2(index, tmp_path):
    run = cli("build", "0.5.20", "--out", str(tmp_path / "out"), "--with", "ray ==")
    assert run.returncode == 2 and "--with" in run.stderr and "Traceback" not in run.stderr
