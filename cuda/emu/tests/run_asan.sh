#!/usr/bin/env bash
# Builds the emulator runtime, its self-tests and a small driver with
# AddressSanitizer, then checks two things:
#   1. every self-test passes under ASan with no report;
#   2. a planted out-of-bounds write in a kernel (planted_oob.cu) is reported
#      by ASan, and the report names the kernel's source file:line.
# Exit 0 only if both hold. Run from the repository root:
#   bash cuda/emu/tests/run_asan.sh
# Builds into a temporary directory; CXX overrides the compiler (default g++).
set -euo pipefail

root=$(pwd)
if [[ ! -f "$root/cuda/emu/cuda_emu.h" ]]; then
  echo "run_asan.sh: run from the repository root" >&2
  exit 2
fi
cxx=${CXX:-g++}
out=$(mktemp -d "${TMPDIR:-/tmp}/ftn_emu_asan.XXXXXX")
trap '[[ -n "${FTN_EMU_ASAN_KEEP:-}" ]] || rm -rf "$out"' EXIT

flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=address -pthread
       -Wall -Wextra -Wno-unknown-pragmas -I "$root/cuda")  # #pragma unroll: as build.rs

echo "== building with AddressSanitizer in $out"
objs=()
# cuda/gemm.cu: the kernel ftn_emu_bench_gemm (tests/bench_gemm.cpp) launches.
for src in "$root"/cuda/emu/*.cpp "$root"/cuda/emu/tests/*.cpp "$root"/cuda/emu/tests/*.cu \
           "$root"/cuda/gemm.cu; do
  obj="$out/$(basename "$src").o"
  "$cxx" -x c++ "${flags[@]}" -DFTN_EMU_SELFTEST_DRIVER -c "$src" -o "$obj" &
  objs+=("$obj")
done
wait_all() { local rc=0; for job in $(jobs -p); do wait "$job" || rc=1; done; return $rc; }
wait_all || { echo "run_asan.sh: build failed" >&2; exit 1; }
"$cxx" "${flags[@]}" "${objs[@]}" -o "$out/selftest"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:${ASAN_OPTIONS:-}"

echo "== 1. self-tests under ASan"
if ! "$out/selftest" >"$out/selftest.log" 2>&1; then
  cat "$out/selftest.log"
  echo "run_asan.sh: FAIL: self-tests failed or ASan reported an error" >&2
  exit 1
fi
if grep -q "ERROR: AddressSanitizer\|ERROR: LeakSanitizer" "$out/selftest.log"; then
  cat "$out/selftest.log"
  echo "run_asan.sh: FAIL: ASan reported an error during the self-tests" >&2
  exit 1
fi
tail -n 1 "$out/selftest.log"

echo "== 1b. the tensor-core GEMM (mma.sync, ldmatrix, cp.async) under ASan"
if ! "$out/selftest" --gemm 128 128 64 2 >"$out/gemm.log" 2>&1 ||
   grep -q "ERROR: AddressSanitizer\|ERROR: LeakSanitizer" "$out/gemm.log"; then
  cat "$out/gemm.log"
  echo "run_asan.sh: FAIL: the GEMM failed or ASan reported an error" >&2
  exit 1
fi
tail -n 1 "$out/gemm.log"

echo "== 2. planted out-of-bounds write must be caught"
line=$(grep -n "PLANTED-OOB" "$root/cuda/emu/tests/planted_oob.cu" | head -n 1 | cut -d: -f1)
set +e
"$out/selftest" --oob >"$out/oob.log" 2>&1
rc=$?
set -e
if [[ $rc -eq 0 ]] || ! grep -q "ERROR: AddressSanitizer: heap-buffer-overflow" "$out/oob.log"; then
  cat "$out/oob.log"
  echo "run_asan.sh: FAIL: ASan did not report the planted out-of-bounds write (rc=$rc)" >&2
  exit 1
fi
if ! grep -q "planted_oob.cu:$line" "$out/oob.log"; then
  cat "$out/oob.log"
  echo "run_asan.sh: FAIL: the ASan report does not name planted_oob.cu:$line" >&2
  exit 1
fi
grep -m 1 "planted_oob.cu:$line" "$out/oob.log"
echo "run_asan.sh: OK (self-tests clean; planted write reported at planted_oob.cu:$line)"
