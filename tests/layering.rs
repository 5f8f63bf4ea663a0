//! The layering rules of `docs/architecture.md`, checked on the source:
//! * `src/parallel/` shards and communicates; it never touches the kernel
//!   ABI (`kernel_params`) or the kernel table (`kernels`): kernels are
//!   launched by `src/ops/`.
//! * `src/reference/` (the float64 oracles) depends on nothing above
//!   `core`: not on ops, parallel layers, backends or kernels, so an oracle
//!   cannot inherit a bug from the code it checks.
//! * `src/models/` assembles models from the layers: never the kernel ABI
//!   or table either.
//! * `src/core/` is backend-free logic (`no_std`, which CI builds): no
//!   backend, op, parallel or communicator imports.

use std::path::Path;

fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Lines of code (comments dropped) under `dir` that mention any of `banned`.
fn violations(dir: &str, banned: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let files = rust_files(&root);
    assert!(!files.is_empty(), "no Rust files under {dir}");
    let mut v = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for b in banned {
                if code.contains(b) {
                    v.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
    }
    v
}

#[test]
fn parallel_layers_never_touch_kernels() {
    let v = violations(
        "src/parallel",
        &["kernel_params", "kernels::", "crate::kernels"],
    );
    assert!(
        v.is_empty(),
        "src/parallel must launch kernels through src/ops:\n{}",
        v.join("\n")
    );
}

#[test]
fn models_never_touch_kernels() {
    let v = violations(
        "src/models",
        &["kernel_params", "kernels::", "crate::kernels"],
    );
    assert!(
        v.is_empty(),
        "src/models must launch kernels through src/ops:\n{}",
        v.join("\n")
    );
}

#[test]
fn oracles_depend_only_on_core() {
    let v = violations(
        "src/reference",
        &[
            "crate::ops",
            "crate::parallel",
            "crate::backend",
            "crate::kernels",
            "crate::comm",
        ],
    );
    assert!(
        v.is_empty(),
        "src/reference must not depend on what it checks:\n{}",
        v.join("\n")
    );
}

#[test]
fn core_is_backend_free() {
    let v = violations(
        "src/core",
        &[
            "crate::ops",
            "crate::parallel",
            "crate::backend",
            "crate::kernels::",
            "crate::comm",
        ],
    );
    assert!(v.is_empty(), "src/core is no_std logic:\n{}", v.join("\n"));
}

#[test]
fn the_checker_sees_a_planted_violation() {
    // The scan itself must be able to fail: this file names the banned paths.
    let v = violations("tests", &["crate::kernels::"]);
    assert!(!v.is_empty());
}
