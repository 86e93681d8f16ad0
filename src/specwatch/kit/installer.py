"""The ``install.sh`` that every part of a kit carries.

Each run stashes the parts it finds (its own folder and any sibling part folders of the same kit)
under a staging folder. The run that completes the kit verifies every checksum, reassembles split
wheels, installs them with ``pip install --no-index --no-deps --target SITE`` and writes
``SITE/env.sh``. Settings (environment variables):

* ``SPECWATCH_SITE``: where the kit is installed (default ``/tmp/specwatch-site-VERSION``);
* ``SPECWATCH_KIT_STASH``: the staging folder (default ``/tmp/specwatch-kit-VERSION``);
* ``SPECWATCH_KIT_PYTHON``: the interpreter whose pip installs (default ``python3``);
* ``SPECWATCH_BASE_SITE``: for a layered kit, where its base kit is installed (default
  ``/tmp/specwatch-site-BASEVERSION``); its ``env.sh`` is sourced first by this kit's.
"""

from __future__ import annotations

from pathlib import Path

INSTALLER_NAME = "install.sh"

INSTALL_SH = r"""#!/usr/bin/env bash
# Install an SGLang offline kit. Every part folder holds a copy of this script: copy one or more
# part folders to the host and run any copy:   bash KIT/part-NN/install.sh
# Each run stashes the parts it sees under $SPECWATCH_KIT_STASH; the run that completes the kit
# verifies every checksum and installs it into $SPECWATCH_SITE. Then:  source $SPECWATCH_SITE/env.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${SPECWATCH_KIT_PYTHON:-python3}
command -v "$py" >/dev/null || { echo "install.sh: $py not found (set SPECWATCH_KIT_PYTHON)" >&2; exit 2; }
exec "$py" - "$here" <<'PY'
import hashlib, json, os, shutil, subprocess, sys
from pathlib import Path

here = Path(sys.argv[1])
manifest = json.loads((here / "manifest.json").read_text())
version = manifest["sglang_version"]
stash = Path(os.environ.get("SPECWATCH_KIT_STASH", f"/tmp/specwatch-kit-{version}"))
site = Path(os.environ.get("SPECWATCH_SITE", f"/tmp/specwatch-site-{version}"))
py = os.environ.get("SPECWATCH_KIT_PYTHON", "python3")
kit = stash / manifest["kit_id"][:16]
done = site / ".specwatch-kit"

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

def say(line):
    print(f"install.sh: {line}", flush=True)

if done.is_file() and done.read_text().strip() == manifest["kit_id"]:
    say(f"sglang {version} kit already installed in {site}")
    sys.exit(0)

# 1. stash this part and any sibling part of the same kit
kit.mkdir(parents=True, exist_ok=True)
shutil.copyfile(here / "manifest.json", kit / "manifest.json")
part_names = {p["name"]: p for p in manifest["parts"]}
for folder in sorted(here.parent.iterdir()):
    if folder.name not in part_names or not (folder / "manifest.json").is_file():
        continue
    if json.loads((folder / "manifest.json").read_text()).get("kit_id") != manifest["kit_id"]:
        continue
    for entry in part_names[folder.name]["files"]:
        src, dst = folder / entry["name"], kit / entry["name"]
        if src.is_file() and not (dst.is_file() and dst.stat().st_size == entry["size"]):
            shutil.copyfile(src, dst.with_name(dst.name + ".tmp"))
            os.replace(dst.with_name(dst.name + ".tmp"), dst)

# 2. are all parts there?
missing = [p["name"] for p in manifest["parts"]
           if not all((kit / f["name"]).is_file() for f in p["files"])]
if missing:
    have = len(manifest["parts"]) - len(missing)
    say(f"stashed in {kit}: {have} of {len(manifest['parts'])} parts; still to come: "
        + " ".join(missing))
    sys.exit(0)

# 2b. a layered kit needs its base kit installed first (its env.sh is sourced by this one's)
base = manifest.get("base")
if base:
    base_site = Path(os.environ.get("SPECWATCH_BASE_SITE", f"/tmp/specwatch-site-{base['sglang_version']}"))
    mark = base_site / ".specwatch-kit"
    if not (mark.is_file() and mark.read_text().strip() == base["kit_id"]):
        say(f"this kit is layered on the sglang {base['sglang_version']} kit {base['kit_id'][:16]}, "
            f"which is not installed in {base_site}: install that kit first (or set SPECWATCH_BASE_SITE)")
        sys.exit(2)

# 3. verify every file; a bad one is removed so that copying its part again repairs it
bad = []
for part in manifest["parts"]:
    for entry in part["files"]:
        path = kit / entry["name"]
        if path.stat().st_size != entry["size"] or sha256(path) != entry["sha256"]:
            bad.append(part["name"])
            path.unlink()
if bad:
    say("checksum mismatch in " + " ".join(sorted(set(bad))) + ": copy those parts again")
    sys.exit(1)

# 4. reassemble the wheels
wheels = kit / "wheels"
shutil.rmtree(wheels, ignore_errors=True)
wheels.mkdir()
for wheel in manifest["wheels"]:
    target = wheels / wheel["filename"]
    with open(target, "wb") as out:
        for chunk in wheel["chunks"]:
            with open(kit / chunk, "rb") as f:
                shutil.copyfileobj(f, out, 8 << 20)
    if sha256(target) != wheel["sha256"]:
        say(f"{wheel['filename']}: reassembled wheel does not match its checksum")
        sys.exit(1)

# 5. install
if site.exists():
    shutil.rmtree(site)
site.mkdir(parents=True)
say(f"installing {len(manifest['wheels'])} wheels into {site}")
pip = [py, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
       "--disable-pip-version-check", "--quiet", "--target", str(site)]
pyver = manifest["python_version"]
if f"{sys.version_info[0]}.{sys.version_info[1]}" != pyver:
    say(f"note: {py} is Python {sys.version_info[0]}.{sys.version_info[1]}, the kit is for {pyver}")
    pip += ["--only-binary=:all:", "--python-version", pyver, "--implementation", "cp"]
    pip += [a for p in ("manylinux_2_34_x86_64", "manylinux2014_x86_64", "any")
            for a in ("--platform", p)]
    pip += [a for m in range(33, 16, -1) for a in ("--platform", f"manylinux_2_{m}_x86_64")]
run = subprocess.run(pip + [str(wheels / w["filename"]) for w in manifest["wheels"]],
                     env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore"})
if run.returncode != 0:
    say("pip install failed (see above)")
    sys.exit(run.returncode)
shutil.rmtree(wheels)

# 6. env.sh: the site on PYTHONPATH, with the folders its .pth files add (Python reads .pth files
# only in site directories, not on PYTHONPATH): site.addsitedir runs them once here to see which
paths = [str(site)]
probe = ("import site, sys; before = set(sys.path); site.addsitedir(sys.argv[1]); "
         "print('\\n'.join(p for p in sys.path if p not in before))")
added = subprocess.run([py, "-c", probe, str(site)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(site)}).stdout.split()
paths += [p for p in added if p not in paths and Path(p).is_dir()]

def lib_dirs(root):
    found = []
    for folder in sorted(Path(root).glob("nvidia/**/lib")) + sorted(Path(root).glob("nvidia/**/lib64")):
        if folder.is_dir() and any(".so" in f.name for f in folder.iterdir()):
            found.append(str(folder))
    return found

libs = lib_dirs(site)
if libs and manifest["carries_torch"]:
    # the host's own NVIDIA wheels serve the libraries the kit does not carry
    host_sites = subprocess.run([py, "-c", "import site; print('\\n'.join(site.getsitepackages()))"],
                                capture_output=True, text=True).stdout.split()
    libs += [d for s in host_sites for d in lib_dirs(s)]
lines = [f"# SGLang {version} offline kit (kit {manifest['kit_id'][:16]})"]
if base:
    lines.append(f"source {base_site}/env.sh  # the base kit: sglang {base['sglang_version']}")
lines += [
    f"export PYTHONPATH={':'.join(paths)}${{PYTHONPATH:+:$PYTHONPATH}}",
    "export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1",
    "export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1",
]
if libs:
    lines.append(f"export LD_LIBRARY_PATH={':'.join(libs)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}")
(site / "env.sh").write_text("\n".join(lines) + "\n")
done.write_text(manifest["kit_id"] + "\n")
say(f"sglang {version} installed in {site}; now: source {site}/env.sh")
PY
"""
"""The installer: bash for the entry point, Python (the host's, no packages needed) for the work."""


def write_installer(folder: Path) -> Path:
    """Write ``install.sh`` (executable) into ``folder``."""
    path = folder / INSTALLER_NAME
    path.write_text(INSTALL_SH)
    path.chmod(0o755)
    return path
