"""Make an N-times synthetic results store from a real one, for measuring the store at scale.

Each record of the source store is written N times into the same results file under OUT: copy
k > 0 has its case's ``output_len`` raised by k (so a distinct case id) and its start and finish
moved k seconds later; everything else is kept. Usage:
``python scripts/synth_store.py N OUT [--source results]``.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timedelta
from pathlib import Path

from specwatch.core.case import Case
from specwatch.store.jsonl import result_files


def synth_line(data: dict, k: int) -> dict:
    """Copy ``k`` of one record dict (copy 0: the record itself)."""
    if k == 0:
        return data
    d = json.loads(json.dumps(data))
    d["case"]["output_len"] += k
    d["case_id"] = Case.model_validate(d["case"]).case_id
    for field in ("started_at", "finished_at"):
        t = datetime.fromisoformat(d["provenance"][field]) + timedelta(seconds=k)
        d["provenance"][field] = t.isoformat()
    return d


def synth_store(n: int, out: Path, source: Path) -> int:
    """Write the N-times store of ``source`` under ``out``; returns the records written."""
    written = 0
    for src in result_files(source):
        if not src.is_file():
            continue
        lines = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
        dest = out / src.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "w") as f:
            for k in range(n):
                for d in lines:
                    f.write(json.dumps(synth_line(d, k)) + "\n")
                    written += 1
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, help="copies of each record")
    ap.add_argument("out", type=Path, help="new results root (must not exist)")
    ap.add_argument("--source", type=Path, default=Path("results"), help="results root to copy")
    args = ap.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out}: exists; give a new folder")
    print(f"{args.out}: {synth_store(args.n, args.out, args.source)} records")


if __name__ == "__main__":
    main()
