#!/usr/bin/env bash
# Runs on the device machine from the repository root, over a carried
# gpu-bundle/ (scripts/gpu_bundle.sh): the one-shot device check.
#   0. the driver-level probes of tools/probes, if the bundle has them;
#   1. ferrotron-gpu-check's steps, each its own process under its own
#      timeout: env, bandwidth and gemm first (timings on a quiet GPU), then
#      correctness and nccl;
#   2. train_gpt, if the bundle has it (FTN_CHECK_TRAIN: its arguments, or
#      `none`; at most 120 s);
#   3. every test binary in the bundle, FTN_CHECK_JOBS at a time (their GPU
#      cases run; the emulator cases too);
#   4. compute-sanitizer memcheck, racecheck and synccheck over
#      `ferrotron-gpu-check small` (one small launch of every kernel).
# Every step's timeout is clipped to what is left of FTN_CHECK_BUDGET
# (seconds, default 420), and summary.md is appended to as each step ends,
# so a timeout loses nothing already measured. Writes under $OUT:
#   summary.md, and logs.tgz (every step's full output)
# Without a GPU it still runs: every GPU step says SKIPPED and why.
# Env: OUT (default ./gpu-out), FTN_CHECK_TIMEOUT per step (default 180 s),
# FTN_CHECK_BUDGET (default 420 s), FTN_CHECK_JOBS (default 4),
# FTN_CHECK_STEPS (the check's steps to run; default all five, in order).
set -uo pipefail
BUNDLE="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT/logs"
LIMIT="${FTN_CHECK_TIMEOUT:-180}"
BUDGET="${FTN_CHECK_BUDGET:-420}"
JOBS="${FTN_CHECK_JOBS:-4}"
T0=$(date +%s)
export T0 BUDGET LIMIT OUT
CHECK="$BUNDLE/ferrotron-gpu-check"

# Seconds a step may take: its own limit, clipped to the budget left.
step_limit() {
  local left=$((BUDGET - ($(date +%s) - T0)))
  [ "$left" -lt "$LIMIT" ] && echo "$left" || echo "$LIMIT"
}
export -f step_limit

# ferrotron finds NCCL itself (FTN_NCCL_LIBRARY, LD_LIBRARY_PATH, CUDA_HOME,
# python site-packages nvidia/nccl/lib). cuBLASLt is used only by the gemm
# step, through cudarc, which asks for libcublasLt.so / .so.12 while the
# wheels ship .so.13: link the unversioned name in a private folder.
SITE="$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)"
LIBS="$OUT/../ftn-libs"
mkdir -p "$LIBS"
LT_SO="$(find "$SITE/nvidia" -name 'libcublasLt.so.*' 2>/dev/null | sort | head -1)"
[ -n "$LT_SO" ] && ln -sf "$LT_SO" "$LIBS/libcublasLt.so"
[ -n "$LT_SO" ] && for f in "$(dirname "$LT_SO")"/libcublas.so.*; do ln -sf "$f" "$LIBS/libcublas.so"; done
export LD_LIBRARY_PATH="$LIBS:${LD_LIBRARY_PATH:-}"

S="$OUT/summary.md"
{
  echo "# ferrotron GPU check"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- commit: $(cat "$BUNDLE/COMMIT" 2>/dev/null || echo unknown)"
  echo "- cuBLASLt: ${LT_SO:-not found}"
  echo "- compute-sanitizer: $(command -v compute-sanitizer || echo 'not found')"
} > "$S"

# The driver-level probes first (tools/probes: plain CUDA, no ferrotron),
# each under its own 60 s limit; their full output goes to the logs.
if [ -d "$BUNDLE/probes" ]; then
  printf '\n## Probes (tools/probes)\n\n' >> "$S"
  for probe in "$BUNDLE"/probes/*; do
    name="$(basename "$probe")"
    timeout 60 "$probe" > "$OUT/logs/probe-$name.log" 2>&1
    rc=$?
    echo "- $name: rc $rc, $(grep -c WAITS "$OUT/logs/probe-$name.log") case(s) waited:" >> "$S"
    grep WAITS "$OUT/logs/probe-$name.log" | sort | uniq -c | sed 's/^/    /' >> "$S"
  done
fi

for step in ${FTN_CHECK_STEPS:-env bandwidth gemm correctness nccl}; do
  lim=$(step_limit)
  if [ "$lim" -le 5 ]; then
    printf '\n## %s\n\nnot run (budget spent)\n' "$step" >> "$S"
    continue
  fi
  timeout "$lim" "$CHECK" --out "$OUT" "$step" > "$OUT/logs/step-$step.log" 2>&1
  rc=$?
  [ $rc -eq 124 ] && printf '\n**%s: TIMEOUT after %s s** (the rows above are what it measured)\n' "$step" "$lim" >> "$S"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && printf '\n**%s: exit %s** (see logs/step-%s.log)\n' "$step" "$rc" "$step" >> "$S"
done

# A GPT trained on one GPU (NCCL, one rank), run from the repository root
# (its corpus, data/sonnets.txt): the last lines give tokens/s and MFU.
TRAIN="${FTN_CHECK_TRAIN:---launch 1 --tp 1 --pp 1 --dp 1 --layers 8 --hidden 1024 --heads 16 --seq 1024 --micro-batch 8 --micro-batches 4 --steps 30 --sample 0}"
if [ -x "$BUNDLE/train_gpt" ] && [ "$TRAIN" != none ]; then
  lim=$(step_limit)
  [ "$lim" -gt 120 ] && lim=120
  if [ "$lim" -le 10 ]; then
    printf '\n## train_gpt\n\nnot run (budget spent)\n' >> "$S"
  else
    start=$(date +%s)
    # shellcheck disable=SC2086
    timeout "$lim" "$BUNDLE/train_gpt" $TRAIN > "$OUT/logs/train_gpt.log" 2>&1
    rc=$?
    {
      printf '\n## train_gpt\n\n`train_gpt %s`: rc %s, %s s\n\n```text\n' "$TRAIN" "$rc" "$(($(date +%s) - start))"
      grep -E 'parameters|step +[0-9]+/|^done|loss [0-9.]+ ->|MFU' "$OUT/logs/train_gpt.log" | tail -12
      printf '```\n'
    } >> "$S"
  fi
fi

if [ -d "$BUNDLE/tests" ]; then
  {
    echo
    echo "## Test binaries ($JOBS at a time)"
    echo
    echo "| binary | result | passed | failed | GPU cases skipped | seconds |"
    echo "| --- | --- | --- | --- | --- | --- |"
  } >> "$S"
  run_test() {
    t="$1"
    name="$(basename "$t")"
    log="$OUT/logs/test-$name.log"
    lim=$(step_limit)
    if [ "$lim" -le 5 ]; then
      echo "| $name | not run (budget spent) | | | | |" >> "$OUT/summary.md"
      return
    fi
    start=$(date +%s)
    timeout "$lim" "$t" > "$log" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    passed=$(grep -o '[0-9]* passed' "$log" | awk '{s += $1} END {print s + 0}')
    failed=$(grep -o '[0-9]* failed' "$log" | awk '{s += $1} END {print s + 0}')
    skipped=$(grep -c 'SKIPPED' "$log")
    case $rc in
      0) res=pass ;;
      124) res="TIMEOUT (${lim} s)" ;;
      *) res="FAIL (rc $rc)" ;;
    esac
    echo "| $name | $res | $passed | $failed | $skipped | $secs |" >> "$OUT/summary.md"
  }
  export -f run_test
  ls "$BUNDLE"/tests/* | xargs -P "$JOBS" -I{} bash -c 'run_test {}'
fi

if command -v compute-sanitizer > /dev/null; then
  {
    echo
    echo "## compute-sanitizer over \`ferrotron-gpu-check small\`"
    echo
    echo "| tool | result | errors line |"
    echo "| --- | --- | --- |"
  } >> "$S"
  for tool in memcheck racecheck synccheck; do
    lim=$(step_limit)
    [ "$lim" -le 10 ] && { echo "| $tool | not run (budget spent) | |" >> "$S"; continue; }
    log="$OUT/logs/sanitizer-$tool.log"
    timeout "$lim" compute-sanitizer --tool "$tool" --print-limit 20 \
      "$CHECK" --out "$OUT/sanitizer-$tool" small > "$log" 2>&1
    rc=$?
    # memcheck also counts CUDA API errors; NCCL's start-up probes for
    # kernel images it lacks ("no kernel image ... ncclInitKernelsForDevice")
    # are reported that way and are not ours: say how many there were.
    nccl_api=$(grep -A2 '^========= Program hit' "$log" | grep -c 'in libnccl' || true)
    echo "| $tool | rc $rc | $(grep -m1 'ERROR SUMMARY' "$log") (of which API errors inside libnccl: $nccl_api) |" >> "$S"
  done
else
  printf '\n## compute-sanitizer\n\nSKIPPED: compute-sanitizer is not on PATH\n' >> "$S"
fi
printf '\ntotal: %s s of a %s s budget\n' "$(($(date +%s) - T0))" "$BUDGET" >> "$S"
# The device tool returns at most 8 files: pack the logs into one.
(cd "$OUT" && tar czf logs.tgz logs sanitizer-* 2>/dev/null; rm -rf logs sanitizer-*)
cat "$S"
