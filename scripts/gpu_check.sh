#!/usr/bin/env bash
# Runs on the device machine from the repository root, over a carried
# gpu-bundle/ (scripts/gpu_bundle.sh). Order, so that a timeout loses the
# least valuable part and every timing runs on a quiet GPU:
#   1. environment (GPU, driver, clocks, which NCCL / cuBLASLt files exist);
#   2. the CUDA benchmarks (criterion filter `cuda`), one at a time;
#   3. gemm_vs_cublaslt (ours vs cuBLASLt, same shapes, same run);
#   4. every test binary, FTN_CHECK_JOBS at a time (GPU cases run, emulator
#      cases too);
#   5. compute-sanitizer memcheck, racecheck and synccheck over the
#      small-shape test binaries.
# Every step has its own timeout, clipped to what is left of FTN_CHECK_BUDGET
# (seconds, default 420), and summary.md is appended to as each step ends, so
# a timeout loses nothing already measured. Writes under $OUT:
#   summary.md, and logs.tgz (tests/*.log, benches/*.log, sanitizer/*.log)
# Without a GPU it still runs: GPU cases are reported as skipped.
# Env: OUT (default ./gpu-out), FTN_CHECK_TIMEOUT per step (default 240 s),
# FTN_CHECK_BUDGET (default 420 s), FTN_CHECK_JOBS (default 4),
# FTN_BENCH_FILTER (default cuda).
set -uo pipefail
BUNDLE="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT/tests" "$OUT/benches" "$OUT/sanitizer"
LIMIT="${FTN_CHECK_TIMEOUT:-240}"
BUDGET="${FTN_CHECK_BUDGET:-420}"
JOBS="${FTN_CHECK_JOBS:-4}"
T0=$(date +%s)
export T0 BUDGET LIMIT OUT

# Seconds a step may take: its own limit, clipped to the budget left.
step_limit() {
  local left=$((BUDGET - ($(date +%s) - T0)))
  [ "$left" -lt "$LIMIT" ] && echo "$left" || echo "$LIMIT"
}
export -f step_limit

# ferrotron finds NCCL itself (FTN_NCCL_LIBRARY, LD_LIBRARY_PATH, CUDA_HOME,
# python site-packages nvidia/nccl/lib): the comm_nccl log names the file.
# cuBLASLt is only used by the gemm_vs_cublaslt bench, through cudarc, which
# asks for libcublasLt.so / .so.12 while the wheels ship .so.13: link the
# unversioned name to it in a private folder.
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
  echo "- device: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader 2>/dev/null | head -1 || echo 'no nvidia-smi')"
  echo "- libcuda: $(ldconfig -p 2>/dev/null | grep -m1 'libcuda.so.1' | awk '{print $NF}')"
  echo "- cuBLASLt: ${LT_SO:-not found}"
  echo "- compute-sanitizer: $(command -v compute-sanitizer || echo 'not found')"
  echo
} > "$S"

echo "## Benchmarks (criterion filter \`${FTN_BENCH_FILTER:-cuda}\`)" >> "$S"
echo >> "$S"
echo '```' >> "$S"
for b in "$BUNDLE"/benches/*; do
  [ -x "$b" ] || continue
  name="$(basename "$b")"
  [ "$name" = gemm_vs_cublaslt ] && continue
  log="$OUT/benches/$name.log"
  lim=$(step_limit)
  [ "$lim" -le 5 ] && { echo "$name: not run (budget spent)" >> "$S"; continue; }
  timeout "$lim" "$b" --bench "${FTN_BENCH_FILTER:-cuda}" --warm-up-time 1 --measurement-time 2 \
    --noplot > "$log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && echo "$name: exit $rc (see benches/$name.log)" >> "$S"
  # criterion prints the id on one line, then `time:` and `thrpt:` lines.
  awk '/^[A-Za-z_0-9].*\// {id = $1} /time:|thrpt:/ {print id, $0}' "$log" >> "$S"
done
echo '```' >> "$S"

if [ -x "$BUNDLE/benches/gemm_vs_cublaslt" ]; then
  echo >> "$S"
  echo "## GEMM vs cuBLASLt" >> "$S"
  echo >> "$S"
  timeout "$(step_limit)" "$BUNDLE/benches/gemm_vs_cublaslt" > "$OUT/benches/gemm_vs_cublaslt.log" 2>&1
  echo "(exit $?)" >> "$S"
  cat "$OUT/benches/gemm_vs_cublaslt.log" >> "$S"
fi

{
  echo
  echo "## Tests ($JOBS at a time)"
  echo
  echo "| binary | result | passed | failed | GPU cases skipped | seconds |"
  echo "| --- | --- | --- | --- | --- | --- |"
} >> "$S"
run_test() {
  t="$1"
  name="$(basename "$t")"
  log="$OUT/tests/$name.log"
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
{
  echo
  echo "Notes from the test logs:"
  echo
  grep -h "comm_nccl: NCCL from\|Device::cuda(0) on\|first launch after creation" "$OUT"/tests/*.log | sed 's/^/- /'
} >> "$S"

if command -v compute-sanitizer > /dev/null; then
  {
    echo
    echo "## compute-sanitizer (GPU cases of small-shape tests)"
    echo
    echo "| tool, binary | result | errors line |"
    echo "| --- | --- | --- |"
  } >> "$S"
  for tool_name in memcheck:bias_gelu memcheck:softmax memcheck:layernorm memcheck:multi_tensor \
    memcheck:vocab_parallel racecheck:softmax racecheck:layernorm synccheck:softmax synccheck:layernorm; do
    tool="${tool_name%%:*}" name="${tool_name#*:}"
    t="$BUNDLE/tests/$name"
    [ -x "$t" ] || continue
    lim=$(step_limit)
    [ "$lim" -le 10 ] && { echo "| $tool $name | not run (budget spent) | |" >> "$S"; continue; }
    log="$OUT/sanitizer/$tool-$name.log"
    timeout "$lim" compute-sanitizer --tool "$tool" --print-limit 20 "$t" > "$log" 2>&1
    rc=$?
    echo "| $tool $name | rc $rc | $(grep -m1 'ERROR SUMMARY' "$log") |" >> "$S"
  done
fi
echo >> "$S"
echo "total: $(($(date +%s) - T0)) s of a ${BUDGET} s budget" >> "$S"
# The device tool returns at most 8 files: pack the logs into one.
(cd "$OUT" && tar czf logs.tgz tests benches sanitizer && rm -rf tests benches sanitizer)
cat "$S"
