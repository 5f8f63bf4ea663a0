//! Builds the C and C++ consumers in `tests/c/` against `include/ferrotron.h`
//! and the library cargo built (the C ones link the static library, the C++
//! one the shared library), runs them on the emulator with a fresh seed, and
//! checks that they pass. `consumer_tp.c` covers the tensor-parallel part of
//! the ABI (one thread per rank, a forked process for the rendezvous);
//! `consumer_pipeline.c` the pipeline schedules and simulator;
//! `consumer_ddp.c` fused AdamW, DDP (dp = 2, one thread per rank), the
//! distributed optimizer and the memory table. Also
//! compiles the header alone as C99 and C++17 with
//! `-Wall -Wextra -Werror -pedantic`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `target/<profile>` (this test binary lives in `target/<profile>/deps`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// Where libferrotron.{a,so} are. `cargo test` does not build a package's
/// cdylib/staticlib for its integration tests, so the first caller builds
/// them with cargo into a target dir of their own (no lock shared with the
/// running `cargo test`), as trybuild does; later builds are incremental.
fn lib_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let target = profile_dir().join("ffi-consumers-build");
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        run(
            Command::new(cargo)
                .args([
                    "build",
                    "--offline",
                    "-q",
                    "-p",
                    "ferrotron-ffi",
                    "--target-dir",
                ])
                .arg(&target)
                .current_dir(repo()),
            "building libferrotron (cdylib + staticlib) for the consumers",
        );
        target.join("debug")
    })
    .clone()
}

fn out_dir() -> PathBuf {
    let d = profile_dir().join("ffi-consumers");
    std::fs::create_dir_all(&d).expect("create output dir");
    d
}

fn tool(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{cmd:?}\n{text}",
        out.status
    );
    text
}

fn seed() -> u64 {
    std::env::var("FTN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_007)
        })
}

/// The native libraries a Rust static library needs (`--print native-static-libs` on Linux).
const NATIVE: &[&str] = &[
    "-lstdc++",
    "-lgcc_s",
    "-lutil",
    "-lrt",
    "-lpthread",
    "-lm",
    "-ldl",
    "-lc",
];

#[test]
fn header_compiles_as_c99_and_cpp17() {
    let header = repo().join("include/ferrotron.h");
    for (compiler, std, lang) in [
        (tool("CC", "cc"), "-std=c99", "c"),
        (tool("CXX", "c++"), "-std=c++17", "c++"),
    ] {
        run(
            Command::new(&compiler)
                .args([
                    std,
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                    "-pedantic",
                    "-fsyntax-only",
                    "-x",
                    lang,
                ])
                .arg(&header),
            &format!("{compiler} {std} on ferrotron.h"),
        );
    }
}

/// Compiles `ffi/tests/c/<source>` as C99 against the static library, runs
/// it with a seed and expects its "all checks passed".
fn c_consumer_passes(source: &str, exe_name: &str, extra_flags: &[&str], what: &str) {
    let lib = lib_dir().join("libferrotron.a");
    assert!(lib.exists(), "{} not built", lib.display());
    let exe = out_dir().join(exe_name);
    run(
        Command::new(tool("CC", "cc"))
            .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-O1", "-g"])
            .args(extra_flags)
            .arg("-I")
            .arg(repo().join("include"))
            .arg(repo().join("ffi/tests/c").join(source))
            .arg(&lib)
            .args(NATIVE)
            .arg("-o")
            .arg(&exe),
        &format!("compiling the {what}"),
    );
    let seed = seed();
    let out = run(
        Command::new(&exe).arg(seed.to_string()),
        &format!("the {what} (seed {seed})"),
    );
    assert!(out.contains("all checks passed"), "{out}");
}

#[test]
fn c_consumer_passes_on_the_emulator() {
    c_consumer_passes("consumer.c", "consumer_c", &[], "C consumer");
}

#[test]
fn c_tp_consumer_passes_on_the_emulator() {
    c_consumer_passes(
        "consumer_tp.c",
        "consumer_tp_c",
        &["-pthread"],
        "C tensor-parallel consumer",
    );
}

#[test]
fn c_ddp_consumer_passes_on_the_emulator() {
    c_consumer_passes(
        "consumer_ddp.c",
        "consumer_ddp_c",
        &["-pthread"],
        "C optimizer / data-parallel consumer",
    );
}

#[test]
fn c_dlpack_consumer_passes_on_the_emulator() {
    c_consumer_passes(
        "consumer_dlpack.c",
        "consumer_dlpack_c",
        &[],
        "C DLPack consumer",
    );
}

#[test]
fn c_pipeline_consumer_passes() {
    c_consumer_passes(
        "consumer_pipeline.c",
        "consumer_pipeline_c",
        &[],
        "C pipeline consumer",
    );
}

#[test]
fn cpp_consumer_passes_on_the_emulator() {
    let dir = lib_dir();
    assert!(
        dir.join("libferrotron.so").exists(),
        "libferrotron.so not built"
    );
    let exe = out_dir().join("consumer_cpp");
    run(
        Command::new(tool("CXX", "c++"))
            .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", "-g"])
            .arg("-I")
            .arg(repo().join("include"))
            .arg(repo().join("ffi/tests/c/consumer.cpp"))
            .arg("-L")
            .arg(&dir)
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .args(["-lferrotron", "-lpthread"])
            .arg("-o")
            .arg(&exe),
        "compiling the C++ consumer",
    );
    let seed = seed();
    let out = run(
        Command::new(&exe).arg(seed.to_string()),
        &format!("the C++ consumer (seed {seed})"),
    );
    assert!(out.contains("all checks passed"), "{out}");
}
