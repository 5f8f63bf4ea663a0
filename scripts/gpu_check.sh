#!/usr/bin/env bash
# Runs on the device machine from the repository root, over a carried
# gpu-bundle/ (scripts/gpu_bundle.sh): every test binary (GPU cases run when
# a GPU is usable; the rest run on the emulator), then the benchmarks' CUDA
# cases (criterion filter `cuda`), and writes under $OUT:
#   summary.md      device, commit, a table of test binaries (pass/fail,
#                   GPU cases skipped) and every CUDA benchmark's time and
#                   throughput line;
#   tests/*.log, benches/*.log   the full outputs.
# Without a GPU it still runs: GPU cases are reported as skipped, and the
# CUDA benchmarks do not exist (so the bench table is empty).
# Env: OUT (default ./gpu-out), FTN_CHECK_TIMEOUT per binary (default 240 s),
# FTN_BENCH_FILTER (default cuda).
set -uo pipefail
BUNDLE="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT/tests" "$OUT/benches"
LIMIT="${FTN_CHECK_TIMEOUT:-240}"

# NCCL from the machine's Python environment, when there is one.
NCCL_DIR="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), "lib"))' 2>/dev/null || true)"
[ -n "$NCCL_DIR" ] && export LD_LIBRARY_PATH="$NCCL_DIR:${LD_LIBRARY_PATH:-}"

S="$OUT/summary.md"
{
  echo "# ferrotron GPU check"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- commit: $(cat "$BUNDLE/COMMIT" 2>/dev/null || echo unknown)"
  echo "- device: $(nvidia-smi -L 2>/dev/null | head -1 || echo 'no nvidia-smi')"
  echo "- driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || echo unknown)"
  echo "- NCCL: ${NCCL_DIR:-not found}"
  echo
  echo "## Tests"
  echo
  echo "| binary | result | passed | failed | GPU cases skipped | seconds |"
  echo "| --- | --- | --- | --- | --- | --- |"
} > "$S"

for t in "$BUNDLE"/tests/*; do
  [ -x "$t" ] || continue
  name="$(basename "$t")"
  log="$OUT/tests/$name.log"
  start=$(date +%s)
  timeout "$LIMIT" "$t" > "$log" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  passed=$(grep -o '[0-9]* passed' "$log" | awk '{s += $1} END {print s + 0}')
  failed=$(grep -o '[0-9]* failed' "$log" | awk '{s += $1} END {print s + 0}')
  skipped=$(grep -c 'SKIPPED' "$log")
  case $rc in
    0) res=pass ;;
    124) res="TIMEOUT (${LIMIT} s)" ;;
    *) res="FAIL (rc $rc)" ;;
  esac
  echo "| $name | $res | $passed | $failed | $skipped | $secs |" >> "$S"
done

{
  echo
  echo "## Benchmarks (criterion filter \`${FTN_BENCH_FILTER:-cuda}\`)"
  echo
  echo '```'
} >> "$S"
for b in "$BUNDLE"/benches/*; do
  [ -x "$b" ] || continue
  name="$(basename "$b")"
  log="$OUT/benches/$name.log"
  timeout "$LIMIT" "$b" --bench "${FTN_BENCH_FILTER:-cuda}" --warm-up-time 1 --measurement-time 3 \
    --noplot > "$log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && echo "$name: exit $rc (see benches/$name.log)" >> "$S"
  # criterion prints the id on one line, then `time:` and `thrpt:` lines.
  awk '/^[A-Za-z_0-9].*\// {id = $1} /time:|thrpt:/ {print id, $0}' "$log" >> "$S"
done
echo '```' >> "$S"
cat "$S"
