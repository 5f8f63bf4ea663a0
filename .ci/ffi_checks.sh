#!/usr/bin/env bash
# C ABI checks for CI (issue 6):
#   1. include/ferrotron.h is what the pinned cbindgen generates from ffi/src;
#   2. the header compiles alone as C99 and C++17 with -Wall -Wextra -Werror -pedantic;
#   3. the descriptor fuzz target (fuzz/, cargo-fuzz + libFuzzer) runs briefly without crashing
#      (an input slower than 10 s counts as a crash: validation must not hang).
# The C and C++ consumer programs run in `cargo test` (ffi/tests/c_consumers.rs).
# Env: FTN_FUZZ_SECONDS (default 60), FTN_FUZZ_SEED (default 1: CI explores
# the same way every run, so it is reproducible; fuzz longer with other seeds
# by hand, and commit any crash to fuzz/regressions/descriptors), CC, CXX.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== header drift"
cargo run -q -p xtask -- cbindgen --check

echo "== header as C99 and C++17"
"${CC:-cc}" -std=c99 -Wall -Wextra -Werror -pedantic -fsyntax-only -x c include/ferrotron.h
"${CXX:-c++}" -std=c++17 -Wall -Wextra -Werror -pedantic -fsyntax-only -x c++ include/ferrotron.h

echo "== fuzz: descriptors (${FTN_FUZZ_SECONDS:-60} s)"
CACHE="${FTN_CI_CACHE:-$PWD/.ci-cache}/cargo-fuzz"
if [ ! -x "$CACHE/bin/cargo-fuzz" ]; then
  cargo install cargo-fuzz --locked --root "$CACHE"
fi
# cargo-fuzz needs nightly flags (-Zsanitizer, -Cpasses=sancov): allowed on
# the stable toolchain through RUSTC_BOOTSTRAP.
cd fuzz
mkdir -p corpus/descriptors
# regressions/descriptors holds every input that once crashed (committed):
# libFuzzer runs them first, then mutates from both folders.
RUSTC_BOOTSTRAP=1 FTN_EMU_THREADS=2 "$CACHE/bin/cargo-fuzz" run descriptors corpus/descriptors regressions/descriptors -- \
  -max_total_time="${FTN_FUZZ_SECONDS:-60}" -timeout=10 -max_len=512 -seed="${FTN_FUZZ_SEED:-1}" -print_final_stats=1
echo "ffi checks passed"
