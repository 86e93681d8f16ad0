#!/usr/bin/env bash
# Regenerate the comparison reports in dashboards/reports/ from the committed results. Run after
# `specwatch import` (and `specwatch asv-import` for the asv report); `specwatch dashboard` links them.
# `specwatch compare` exits 1 on a regression: that is the report's verdict, not a failure here.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${SPECWATCH_BIN:-.venv/bin}
out=dashboards/reports
mkdir -p "$out"
report() {  # report NAME BASE HEAD [compare options]
  "$bin/specwatch" compare "$2" "$3" -o "$out/$1.md" "${@:4}" >/dev/null || [ $? = 1 ]
  echo "$out/$1.md: $(sed -n 3p "$out/$1.md")"
}
# between versions, timed metrics must beat the A/A noise budgets (results/noise-budgets.json, from the pair below)
for suite in smoke tree-page; do
  report "sglang-0.5.16-vs-0.5.17-$suite" "sglang_version=0.5.16,suite=$suite" "machine=nvidia-h200-x1,sglang_version=0.5.17,suite=$suite" \
    --budgets results/noise-budgets.json
done
# newest release measured against the last release of the torch 2.11 line (0.5.20 ran with
# --overlap-starts; smoke pinned to its first run, the one taken without other releases beside it)
report "sglang-0.5.17-vs-0.5.20-smoke" "machine=nvidia-h200-x1,sglang_version=0.5.17,suite=smoke" \
  "sglang_version=0.5.20,suite=smoke,overlap=on,run=20261201T114337Z-196a15" --budgets results/noise-budgets.json
report "sglang-0.5.17-vs-0.5.20-tree-page" "sglang_version=0.5.17,suite=tree-page" \
  "sglang_version=0.5.20,suite=tree-page,overlap=on" --budgets results/noise-budgets.json
# where the shared page-aligned decode watermark lands (0.5.19, torch 2.13, --overlap-starts)
for suite in smoke tree-page; do
  report "sglang-0.5.17-vs-0.5.19-$suite" "machine=nvidia-h200-x1,sglang_version=0.5.17,suite=$suite" "sglang_version=0.5.19,suite=$suite,overlap=on" \
    --budgets results/noise-budgets.json
done
# the releases after 0.5.19, each smoke run with --overlap-starts beside the others (layered kits)
report "sglang-0.5.18-vs-0.5.19-smoke" "sglang_version=0.5.18,suite=smoke,overlap=on" "sglang_version=0.5.19,suite=smoke,overlap=on" \
  --budgets results/noise-budgets.json
# the reduced tree-page (triton, topk 8, pages 64/256, batch 1/8, with plain-decoding twins)
report "sglang-0.5.18-vs-0.5.19-tree-page" "sglang_version=0.5.18,suite=tree-page,overlap=on" \
  "sglang_version=0.5.19,suite=tree-page,overlap=on" --budgets results/noise-budgets.json
report "sglang-0.5.22-vs-0.5.23-tree-page" "sglang_version=0.5.22,suite=tree-page,overlap=on" \
  "sglang_version=0.5.23,suite=tree-page,overlap=on" --budgets results/noise-budgets.json
report "sglang-0.5.17-vs-0.5.23-tree-page" "sglang_version=0.5.17,suite=tree-page" \
  "sglang_version=0.5.23,suite=tree-page,overlap=on" --budgets results/noise-budgets.json
report "sglang-0.5.22-vs-0.5.23-smoke" "sglang_version=0.5.22,suite=smoke,overlap=on" "sglang_version=0.5.23,suite=smoke,overlap=on" \
  --budgets results/noise-budgets.json
# the same smoke through --executor ray (one Ray task per engine group, runs without --overlap-starts)
# against the local run of 0.5.23 (--overlap-starts, beside other releases)
report "sglang-0.5.23-local-vs-ray-smoke" "sglang_version=0.5.23,suite=smoke,overlap=on,run=20261201T160100Z-5fef73" \
  "sglang_version=0.5.23,suite=smoke,run=20261201T214052Z-6e143e|20261202T033013Z-790e15" --budgets results/noise-budgets.json
# 0.5.17's smoke ran in waves, its DFLASH sweep with --overlap-starts
report "sglang-0.5.17-vs-0.5.23-smoke" "machine=nvidia-h200-x1,sglang_version=0.5.17,suite=smoke,overlap=off" "sglang_version=0.5.23,suite=smoke,overlap=on" \
  --budgets results/noise-budgets.json
report "sglang-0.5.17-vs-0.5.23-dflash" "sglang_version=0.5.17,suite=dflash,overlap=on" "sglang_version=0.5.23,suite=dflash,overlap=on" \
  --budgets results/noise-budgets.json
# A/A: the first two smoke runs of 0.5.17 (engines started one by one, then 8 at once)
report aa-smoke-sglang-0.5.17 "suite=smoke,sglang_version=0.5.17,run=commit:495713c7323cea483c40c5732763cf81db836f7d|commit:HEAD" \
  "suite=smoke,sglang_version=0.5.17,run=commit:b8380a250ad4d462372048ae79f4ab908a4557b6"
# the clean pair (same checkout, same K = 8, back to back), by run id
report aa-smoke-sglang-0.5.17-back-to-back "suite=smoke,sglang_version=0.5.17,run=20261130T125310Z-f61b83" \
  "suite=smoke,sglang_version=0.5.17,run=20261130T125438Z-74fc85"
# the 8b pairs (bare, probed, bare, probed, bare interleaved): the probed pair by run id
report aa-model-8b-sglang-0.5.17 "suite=model-8b,sglang_version=0.5.17,run=20261130T135740Z-0cae65" \
  "suite=model-8b,sglang_version=0.5.17,run=20261130T140108Z-43359b"
# the timing suite's 8b A/A pair (3 engines, 2 s windows, pinned cores) and its planted host-time
# slowdown (500 µs per verify step: hidden by the overlap scheduler on 8b), floors from its own file
report aa-timing-8b-sglang-0.5.17 "suite=timing,model=8b,run=20261203T074347Z-af27b8" \
  "suite=timing,model=8b,run=20261203T075206Z-f72825" --threshold 0.02
report fault-slow-verify-500us-timing-8b "suite=timing,model=8b,run=20261203T075943Z-784f89" \
  "suite=timing,fault=slow-verify-500us" --threshold 0.02
# the same suite's passes interleaved start by start in one run: clean against the null fault (A/A)
# and against 500 µs of GPU time per verify step, each judged at the floor of its own file
report aa-timing-8b-interleaved-sglang-0.5.17 "suite=timing,model=8b,run=20261204T171014Z-8775fb" \
  "suite=timing,fault=slow-verify-0us,model=8b,run=20261204T171014Z-8775fb"
report fault-slow-verify-gpu-500us-timing-8b "suite=timing,model=8b,run=20261204T171014Z-8775fb" \
  "suite=timing,fault=slow-verify-gpu-500us,model=8b,run=20261204T171014Z-8775fb"
# tiny bs8 (EAGLE chain) on an H100 host: the clean pass and two null faults interleaved start by
# start in one run, three A/A pairs
tiny=run=20261206T021311Z-d11376
report aa-timing-tiny-interleaved-sglang-0.5.17 "suite=timing,model=tiny,$tiny" "suite=timing,fault=slow-verify-0us,model=tiny,$tiny"
report aa-timing-tiny-interleaved-nulls-sglang-0.5.17 "suite=timing,fault=slow-verify-0us,model=tiny,$tiny" \
  "suite=timing,fault=slow-verify-gpu-0us,model=tiny,$tiny"
# tiny batch 1 and 16 (EAGLE chain) on another H100 host, the same three passes: three A/A pairs per
# class, on a host whose decode windows spread 22-41% (batch 8's run above: 3-5%)
edges=run=20261206T180606Z-ac7da0
report aa-timing-tiny-bs1-bs16-interleaved-sglang-0.5.17 "suite=timing,model=tiny,$edges" \
  "suite=timing,fault=slow-verify-0us,model=tiny,$edges"
# the plain loop whose timed calls read 13-24% of their prompts from the radix cache (base) against
# the one that prefills every call in full (head), batch 8 and 16, each on its own H100 host
report baseline-timing-tiny-full-prefill "suite=timing,model=tiny,run=20261206T060714Z-bfbb88" \
  "suite=timing,model=tiny,run=20261206T182004Z-eb73fd"
# two plain-loop runs that prefill in full, each on an H100 host; the head's rounds serpentine and
# both of its loops on SGLang's step clock
report baseline-timing-tiny-step-clock "suite=timing,model=tiny,run=20261206T182004Z-eb73fd" \
  "suite=timing,model=tiny,run=20261207T002215Z-0ceb10"
# a planted 150 µs host stall per verify step (about 5% of the clean step) on the same case and host,
# interleaved with a clean pass: past the floors above, or not
planted=run=20261206T041819Z-e480fb
report fault-slow-verify-150us-timing-tiny "suite=timing,model=tiny,$planted" "suite=timing,fault=slow-verify-150us,model=tiny,$planted"
# the same stall at batch 16 on an H200 whose decode windows spread 29%: called where the budget
# scaled to that noise allows (SGLang's 10th-percentile step), within it elsewhere
planted=run=20261206T203824Z-93de08
report fault-slow-verify-150us-timing-tiny-bs16-h200 "suite=timing,model=tiny,$planted" \
  "suite=timing,fault=slow-verify-150us,model=tiny,$planted"
# batch 16 on an H100 host, the clean pass, the null fault and the 150 µs stall in serpentine rounds:
# an A/A pair (clean vs null) and the stall, which its fast-state steps did not show
bs16=run=20261206T224057Z-088f73
report aa-timing-tiny-bs16-h100-serpentine "suite=timing,model=tiny,$bs16" "suite=timing,fault=slow-verify-0us,model=tiny,$bs16"
report fault-slow-verify-150us-timing-tiny-bs16-h100 "suite=timing,model=tiny,$bs16" \
  "suite=timing,fault=slow-verify-150us,model=tiny,$bs16"
# batch 16 on a third H100 host, the clean pass and 150 µs of GPU time per verify step in serpentine
# rounds: the planted pass read faster, its engines' decode steps in the host's slow state less often
planted=run=20261207T020257Z-a11a41
report fault-slow-verify-gpu-150us-timing-tiny-bs16-h100 "suite=timing,model=tiny,$planted" \
  "suite=timing,fault=slow-verify-gpu-150us,model=tiny,$planted"
# batch 16 on an H100 host, the clean pass and the null fault paired (--paired: each round's two
# engines up together, taking turns batch by batch): an A/A pair timed in the same seconds
paired=run=20261207T135742Z-30787c
report aa-timing-tiny-bs16-h100-paired "suite=timing,model=tiny,$paired" \
  "suite=timing,fault=slow-verify-0us,model=tiny,$paired"
# a second paired A/A pair at batch 16 on another H100 host, and 150 µs of GPU time per verify step
# paired with its clean pass: the host-bound tiny step hid it (the GPU waits on the host anyway)
paired=run=20261207T145405Z-b72caf
report aa-timing-tiny-bs16-h100-paired-2 "suite=timing,model=tiny,$paired" \
  "suite=timing,fault=slow-verify-0us,model=tiny,$paired"
planted=run=20261207T145821Z-b91e08
report fault-slow-verify-gpu-150us-timing-tiny-bs16-h100-paired "suite=timing,model=tiny,$planted" \
  "suite=timing,fault=slow-verify-gpu-150us,model=tiny,$planted"
# 150 µs of host time per verify step at batch 16 paired with its clean pass (4 rounds), and a
# paired A/A pair at batch 8, on a third H100 host whose decode steps ran slow 62-69% of the time
planted=run=20261207T164513Z-aa7eed
report fault-slow-verify-150us-timing-tiny-bs16-h100-paired "suite=timing,model=tiny,$planted" \
  "suite=timing,fault=slow-verify-150us,model=tiny,$planted"
paired=run=20261207T165253Z-250737
report aa-timing-tiny-bs8-h100-paired "suite=timing,model=tiny,$paired" \
  "suite=timing,fault=slow-verify-0us,model=tiny,$paired"
"$bin/specwatch" noise-holdout results/noise-budgets-timing.json --threshold 0.02 -o "$out/aa-holdout-timing.md" >/dev/null
echo "$out/aa-holdout-timing.md: $(sed -n 3p "$out/aa-holdout-timing.md")"
# every A/A pair of the budget file under the other pairs' budgets (the held-out false-positive rate)
"$bin/specwatch" noise-holdout results/noise-budgets.json -o "$out/aa-holdout.md" >/dev/null
echo "$out/aa-holdout.md: $(sed -n 3p "$out/aa-holdout.md")"
# asv's own compare on the results `specwatch asv-import` wrote (one asv commit per SGLang version)
versions=.asv/offline/sglang-versions
if [ -d "$versions" ]; then
  h16=$(git -C "$versions" log --format=%h --grep="sglang 0.5.16$")
  h17=$(git -C "$versions" log --format=%h --grep="sglang 0.5.17$")
  "$bin/asv" compare --config .asv/offline/asv.offline.json --only-changed "$h16" "$h17" \
    > "$out/asv-compare-sglang-0.5.16-vs-0.5.17.md"
  echo "$out/asv-compare-sglang-0.5.16-vs-0.5.17.md: $(grep -c '^| [+-]' "$out/asv-compare-sglang-0.5.16-vs-0.5.17.md") changed"
else
  echo "no $versions: run specwatch asv-import first (asv report left as it is)"
fi
