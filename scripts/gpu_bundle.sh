#!/usr/bin/env bash
# Builds what a GPU session carries to the device machine (which has no
# Rust): the release programs `ferrotron-gpu-check` and `train_gpt` and, unless
# FTN_BUNDLE_TESTS=none, integration-test binaries with GPU cases
# (debug; a test file that never asks for a CUDA device is left out), all built
# with `--features cuda` (sm_80 + sm_90a SASS embedded: the device's CUDA 13.0
# driver needs no JIT), stripped, the probes of tools/probes (when NVCC is
# set), with scripts/gpu_check.sh, into
# gpu-bundle/ (gitignored), packed as gpu-bundle.tar.xz (it must stay under
# the 64 MiB a device call carries). Then, from the device tool's `run`:
#   carry ["gpu-bundle.tar.xz"],
#   command "python3 -m tarfile -e gpu-bundle.tar.xz . && bash gpu-bundle/gpu_check.sh"
# Env: NVCC (else found as build.rs finds it), FTN_BUNDLE_TESTS (default
# `all`: every test with GPU cases; `none`, or a space-separated list of
# test names). Each debug test binary embeds every fatbin (~53 MB stripped,
# ~11.5 MB packed alone), but they are the same bytes in every binary: xz
# with a dictionary larger than the bundle stores them once, so the check
# and all 16 test binaries (with train_gpt and the probes) pack to 42 MB
# (2026-12-04; 6 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
FTN_BUNDLE_TESTS="${FTN_BUNDLE_TESTS:-all}"
OUT=gpu-bundle
rm -rf "$OUT"
mkdir -p "$OUT/tests"

# Paths of the executables cargo reports for one build command.
executables() {
  cargo "$@" --features cuda --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["kind"][0], m["target"]["name"], m["executable"])
'
}

echo "== ferrotron-gpu-check (release, --features cuda)"
export FTN_COMMIT="$(git rev-parse --short HEAD)"
executables build --release --bin ferrotron-gpu-check | while read -r kind name exe; do
  cp "$exe" "$OUT/ferrotron-gpu-check"
done
[ -x "$OUT/ferrotron-gpu-check" ] || { echo "ferrotron-gpu-check did not build"; exit 1; }
echo "== train_gpt (release example, --features cuda)"
executables build --release --example train_gpt | while read -r kind name exe; do
  cp "$exe" "$OUT/train_gpt"
done
[ -x "$OUT/train_gpt" ] || { echo "train_gpt did not build"; exit 1; }

if [ "${FTN_BUNDLE_TESTS:-all}" != none ]; then
  echo "== test binaries (debug, --features cuda)"
  # c_consumers builds libferrotron with cargo (the device has no Rust); the
  # C ABI's tests run in CI.
  executables test --tests --no-run | while read -r kind name exe; do
    [ "$name" = c_consumers ] && continue
    case " ${FTN_BUNDLE_TESTS:-all} " in *" all "* | *" $name "*) ;; *) continue ;; esac
    # By default only the tests with GPU cases (the rest run the emulator or
    # the in-process communicator only, as in CI): keeps the bundle small.
    if [ "${FTN_BUNDLE_TESTS:-all}" = all ] && ! grep -qE 'devices\(|Device::cuda' "tests/$name.rs" 2>/dev/null; then
      continue
    fi
    cp "$exe" "$OUT/tests/$name"
  done
fi
# The driver-level probes (tools/probes, CUDA runtime only), when an nvcc is
# at hand: gpu_check.sh runs them first.
if [ -n "${NVCC:-}" ] && [ -x "$NVCC" ]; then
  echo "== probes (nvcc: $NVCC)"
  mkdir -p "$OUT/probes"
  for src in tools/probes/*.cu; do
    "$NVCC" -O2 -std=c++17 -arch=sm_90a -cudart static -L"$(dirname "$NVCC")/../lib" \
      -o "$OUT/probes/$(basename "$src" .cu)" "$src"
  done
fi
strip "$OUT"/ferrotron-gpu-check "$OUT"/train_gpt "$OUT"/tests/* 2>/dev/null || true
cp scripts/gpu_check.sh "$OUT/"
git rev-parse HEAD > "$OUT/COMMIT"
du -sh "$OUT"
echo "== packing gpu-bundle.tar.xz"
# One dictionary larger than the whole bundle: every binary embeds the same
# fatbins, so xz stores them once and the later copies cost almost nothing.
tar cf - "$OUT" | xz -T1 --lzma2=preset=6e,dict=1GiB > gpu-bundle.tar.xz
ls -la gpu-bundle.tar.xz
size=$(stat -c %s gpu-bundle.tar.xz)
[ "$size" -lt $((60 * 1024 * 1024)) ] || echo "WARNING: $size bytes: with the repository it may not fit the 64 MiB a device call carries"
