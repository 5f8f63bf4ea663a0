//! Builds the kernels in `cuda/`.
//!
//! * feature `std` (default): every `cuda/*.cu` plus the emulator runtime
//!   `cuda/emu/*.cpp` compiled by the host C++ compiler into `libftn_emu.a`;
//!   the emulator self-tests into `libftn_emu_selftest.a` (linked by tests and
//!   benches only); and `kernels.rs`, the typed table of every kernel.
//! * feature `cuda`: each `cuda/*.cu` also compiled by nvcc into a fatbin
//!   (sm_80, sm_90a SASS + compute_90 PTX), embedded through `fatbins.rs`.

#[path = "buildscript/kernel_table.rs"]
mod kernel_table;
#[path = "buildscript/nvcc.rs"]
mod nvcc;

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=buildscript");
    // Recursive: the kernels, their headers and the kernel ABI (cuda/params).
    println!("cargo:rerun-if-changed=cuda");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    if std::env::var_os("CARGO_FEATURE_STD").is_none() {
        return; // the no_std core needs no kernels
    }
    let kernel_sources = sources(Path::new("cuda"), &["cu"]);
    let kernels = kernel_table::scan(&kernel_sources);
    kernel_table::write(&kernels, &out_dir.join("kernels.rs"));

    // Kernel code carries the race check's hooks (see `racecheck`); the
    // runtime that implements them must not.
    let racecheck = racecheck();
    let kernel_objects = kernel_build(racecheck)
        .files(&kernel_sources)
        .compile_intermediates();
    let runtime = sources(Path::new("cuda/emu"), &["cpp"]);
    emulator_build()
        .files(&runtime)
        .objects(&kernel_objects)
        .compile("ftn_emu");

    let selftests = sources(Path::new("cuda/emu/tests"), &["cpp", "cu"]);
    if !selftests.is_empty() {
        kernel_build(racecheck)
            .files(&selftests)
            .cargo_metadata(false)
            .compile("ftn_emu_selftest");
        println!("cargo:rustc-link-search=native={}", out_dir.display());
    }

    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        nvcc::build_fatbins(&kernel_sources, &out_dir);
    }
}

/// The host C++ compiler set up for kernel sources and the emulator.
fn emulator_build() -> cc::Build {
    let mut b = cc::Build::new();
    b.cpp(true)
        .std("c++20")
        .include("cuda")
        .flag("-x")
        .flag("c++")
        .flag("-pthread")
        .flag_if_supported("-fno-strict-aliasing")
        .flag("-Wno-unknown-pragmas")
        .warnings(true)
        .extra_warnings(true);
    // Kernels are hot even in debug builds of the crate; keep them fast but
    // debuggable (gdb steps -O1 code well enough; FTN_EMU_DEBUG=1 gives -O0).
    let debug = std::env::var("FTN_EMU_DEBUG").is_ok_and(|v| v == "1");
    println!("cargo:rerun-if-env-changed=FTN_EMU_DEBUG");
    b.opt_level(if debug { 0 } else { 3 }).debug(true);
    // Floating point as written: no a*b+c contracted into an fma (the host's
    // default for GNU C++), so results do not depend on the ISA flags below.
    b.flag("-ffp-contract=off");
    // Floating point never traps here (no code reads the exception flags),
    // so g++ may evaluate both sides of a select: with it, a kernel's loop
    // over its per-thread vector vectorises (GeLU, exponentials); without
    // it, jump threading leaves a branch that stops the vectoriser. It does
    // not change a result.
    b.flag("-fno-trapping-math");
    if host_isa_v3() {
        b.flag("-march=x86-64-v3");
    }
    // Small memset/memcpy (a kernel's `uint32_t w[8][4] = {}`, an mma
    // tile's operand capture) as vector moves, large ones as calls into
    // libc: never `rep stos`/`rep movs`, whose start-up costs tens of
    // cycles. g++ 12's generic tuning emits them for constant sizes from
    // 88 bytes up and for sizes known only at run time.
    #[cfg(target_arch = "x86_64")]
    {
        b.flag_if_supported("-mmemset-strategy=vector_loop:512:noalign,libcall:-1:noalign");
        b.flag_if_supported("-mmemcpy-strategy=vector_loop:512:noalign,libcall:-1:noalign");
    }
    b
}

/// Whether kernel and emulator code may use x86-64-v3 (AVX2, FMA, BMI2,
/// F16C): building for this machine (target = host), which has them, and not
/// opted out with `FTN_EMU_NATIVE=0`. Bitwise neutral (`-ffp-contract=off`,
/// no fast-math): `fmaf` becomes one instruction instead of a call into a
/// soft fma (docs/perf.md has what it bought).
fn host_isa_v3() -> bool {
    println!("cargo:rerun-if-env-changed=FTN_EMU_NATIVE");
    if std::env::var("FTN_EMU_NATIVE").is_ok_and(|v| v == "0") {
        return false;
    }
    let host = std::env::var("HOST").unwrap_or_default();
    if host != std::env::var("TARGET").unwrap_or_default() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        host.starts_with("x86_64")
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("bmi1")
            && std::is_x86_feature_detected!("bmi2")
            && std::is_x86_feature_detected!("f16c")
            && std::is_x86_feature_detected!("lzcnt")
            && std::is_x86_feature_detected!("movbe")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether kernel code is compiled with the emulator's shared-memory race
/// check (`-fsanitize=thread` hooks, implemented by `cuda/emu/racecheck.cpp`
/// without ThreadSanitizer's runtime): in debug builds (tests), not in
/// release builds (benchmarks, training runs); `FTN_EMU_RACECHECK=1|0`
/// overrides.
fn racecheck() -> bool {
    println!("cargo:rerun-if-env-changed=FTN_EMU_RACECHECK");
    match std::env::var("FTN_EMU_RACECHECK").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => std::env::var("PROFILE").is_ok_and(|p| p == "debug"),
    }
}

/// The emulator build for kernel sources: instrumented when `racecheck`.
fn kernel_build(racecheck: bool) -> cc::Build {
    let mut b = emulator_build();
    if racecheck {
        b.flag("-fsanitize=thread")
            .flag_if_supported("--param=tsan-instrument-func-entry-exit=0");
    }
    b
}

/// Files directly in `dir` with one of `exts`, sorted.
fn sources(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_file()
                        && p.extension()
                            .and_then(|e| e.to_str())
                            .is_some_and(|e| exts.contains(&e))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}
