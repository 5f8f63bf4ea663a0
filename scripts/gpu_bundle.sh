#!/usr/bin/env bash
# Builds what a GPU session carries to the device machine (which has no Rust):
# every integration-test binary and every benchmark binary built with
# `--features cuda` (sm_80 + sm_90a SASS embedded: the device's CUDA 13.0
# driver needs no JIT), stripped, into gpu-bundle/ (gitignored), plus
# scripts/gpu_check.sh, packed as gpu-bundle.tar.xz (the binaries share their
# embedded fatbins, so xz takes 564 MB down to ~46 MB, under the 64 MiB a
# device run may carry). Then, from the tool library's device `run`:
#   carry ["gpu-bundle.tar.xz"],
#   command "python3 -m tarfile -e gpu-bundle.tar.xz . && bash gpu-bundle/gpu_check.sh"
# Env: NVCC (else found as build.rs finds it), FTN_BUNDLE_TESTS (default
# all), FTN_BUNDLE_BENCHES (default all).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=gpu-bundle
rm -rf "$OUT"
mkdir -p "$OUT/tests" "$OUT/benches"

# Paths of the executables cargo reports for one build command.
executables() {
  cargo "$@" --features cuda --no-run --message-format=json 2>/dev/null |
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

echo "== tests (debug, --features cuda)"
# c_consumers builds libferrotron with cargo (the device has no Rust); the
# C ABI's tests run in CI.
executables test --tests | while read -r kind name exe; do
  [ "$name" = c_consumers ] && continue
  case " ${FTN_BUNDLE_TESTS:-all} " in *" all "* | *" $name "*) ;; *) continue ;; esac
  cp "$exe" "$OUT/tests/$name"
done
echo "== benches (release, --features cuda)"
executables bench --benches | while read -r kind name exe; do
  [ "$kind" = bench ] || continue # the library's own (libtest) harness
  case " ${FTN_BUNDLE_BENCHES:-all} " in *" all "* | *" $name "*) ;; *) continue ;; esac
  cp "$exe" "$OUT/benches/$name"
done
strip "$OUT"/tests/* "$OUT"/benches/* 2>/dev/null || true
cp scripts/gpu_check.sh "$OUT/"
git rev-parse HEAD > "$OUT/COMMIT"
du -sh "$OUT"
ls "$OUT/tests" "$OUT/benches"
echo "== packing gpu-bundle.tar.xz (a few minutes)"
tar cf - "$OUT" | xz -9e -T2 > gpu-bundle.tar.xz
ls -la gpu-bundle.tar.xz
