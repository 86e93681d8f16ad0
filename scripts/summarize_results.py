"""Print one line per record of the given JSONL files (for device runs, where rich output is cut)."""

import json
import os
import sys

KEYS = (
    "output_throughput",
    "decode_throughput",
    "step_time",
    "accept_length",
    "lossless_mismatches",
    "leaked_tokens",
    "engine_start_time",
    "req_to_token_row_width",
)
for path in sys.argv[1:]:
    if not os.path.exists(path):  # an unmatched shell glob: the run recorded nothing
        print(f"no records: {path}")
        continue
    for line in open(path):
        r = json.loads(line)
        c, m = r["case"], r["metrics"]
        if r["status"] == "skipped":
            continue
        vals = {k: round(m[k]["value"], 3) for k in KEYS if k in m}
        bad = [k for k, v in r["checks"].items() if not v]
        print(
            path.split("/")[-2],
            path.split("/")[-1][:-6],
            r["status"],
            c["model"],
            c["attention_backend"],
            f"p{c['page_size']} k{c['topk']} bs{c['batch_size']} {c['profile']}",
            vals,
            "FAILED:" + ",".join(bad) if bad else "",
            (r.get("reason") or "")[:300],
        )
