//! Lists every kernel the `.cu` files declare and writes `kernels.rs`: one
//! typed `Kernel<Params>` static per kernel, so launching a kernel with the
//! wrong parameter struct is a compile error, and every emulator entry point
//! is referenced (and so linked); and one `Family<Params>` static per kernel
//! family, keyed by the names' stamped parameters (see [`family_key`]), so an
//! op asks `kernels::SOFTMAX_FWD_WARP.variant(per_lane, dtype)` and a missing
//! combination is a loud error, never a fallback.
//!
//! The list comes from the preprocessor, not from guessing at macros: each
//! file is run through `c++ -E -DFTN_KERNEL_SCAN`, under which `FTN_KERNEL`
//! expands to the marker `ftn_kernel_decl <name> <Params> ;`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub struct KernelDecl {
    pub name: String,
    pub params: String,
    /// Blocks per thread block cluster (`FTN_KERNEL_CLUSTER`), else 1.
    pub cluster: u32,
    /// The .cu file stem: the fatbin module that holds the kernel.
    pub module: String,
}

pub fn scan(files: &[PathBuf]) -> Vec<KernelDecl> {
    let compiler = cc::Build::new().cpp(true).get_compiler();
    let mut out = Vec::new();
    for f in files {
        let output = compiler
            .to_command()
            .args(["-E", "-P", "-x", "c++", "-std=c++20", "-DFTN_KERNEL_SCAN"])
            .args(["-I", "cuda"])
            .arg(f)
            .output()
            .unwrap_or_else(|e| panic!("running the C++ preprocessor on {f:?}: {e}"));
        if !output.status.success() {
            panic!(
                "preprocessing {f:?} failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let text = String::from_utf8_lossy(&output.stdout);
        let module = f.file_stem().unwrap().to_string_lossy().into_owned();
        let mut tokens = text.split_whitespace();
        while let Some(tok) = tokens.next() {
            if tok == "ftn_kernel_decl" {
                let name = tokens.next().expect("kernel name after marker").to_string();
                let params_tok = tokens.next().expect("params type after kernel name");
                let params = params_tok.trim_end_matches(';').to_string();
                // `ftn_kernel_decl <name> <Params> ftn_cluster <C> ;`
                let mut cluster = 1;
                if !params_tok.ends_with(';') {
                    let marker = tokens.next();
                    assert_eq!(marker, Some("ftn_cluster"), "kernel {name}: marker");
                    let c = tokens.next().expect("cluster size after ftn_cluster");
                    cluster = c
                        .trim_end_matches(';')
                        .parse()
                        .unwrap_or_else(|e| panic!("kernel {name}: cluster size {c:?}: {e}"));
                }
                out.push(KernelDecl {
                    name,
                    params,
                    cluster,
                    module: module.clone(),
                });
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    for w in out.windows(2) {
        assert!(
            w[0].name != w[1].name,
            "kernel {} is declared twice",
            w[0].name
        );
    }
    out
}

/// The dtype suffixes kernel names are stamped with (`DType::name`).
const DTYPES: [(&str, &str); 6] = [
    ("f32", "F32"),
    ("f16", "F16"),
    ("bf16", "BF16"),
    ("u8", "U8"),
    ("i32", "I32"),
    ("i64", "I64"),
];

/// Splits a kernel name `ftn_<family>[<N>]_<dtype>[_<dtype>...]` into its
/// family, its numeric variant and its dtypes: the trailing dtype tokens
/// are the dtypes (inputs first); a number ending the last other token is
/// the variant. `ftn_softmax_fwd_warp16_bf16` is family `softmax_fwd_warp`,
/// variant 16, dtypes [BF16]; `ftn_gemm_128x128_bf16_f32` is family
/// `gemm_128x128`, no variant, dtypes [BF16, F32]; `ftn_copy_2d_bytes` is
/// family `copy_2d_bytes` alone.
pub fn family_key(name: &str) -> (String, Option<u32>, Vec<&'static str>) {
    let stem = name.strip_prefix("ftn_").unwrap_or(name);
    let mut tokens: Vec<&str> = stem.split('_').collect();
    let mut dtypes = Vec::new();
    while tokens.len() > 1 {
        match DTYPES
            .iter()
            .find(|(suffix, _)| Some(suffix) == tokens.last())
        {
            Some((_, variant)) => {
                dtypes.insert(0, *variant);
                tokens.pop();
            }
            None => break,
        }
    }
    let mut variant = None;
    if let Some(last) = tokens.last_mut() {
        let digits = last.len() - last.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let letters = &last[..last.len() - digits];
        if digits > 0 && !letters.is_empty() && letters.chars().all(|c| c.is_ascii_lowercase()) {
            variant = last[letters.len()..].parse().ok();
            *last = letters;
        }
    }
    (tokens.join("_"), variant, dtypes)
}

pub fn write(kernels: &[KernelDecl], path: &Path) {
    let mut s =
        String::from("// @generated by build.rs from the FTN_KERNEL declarations in cuda/*.cu\n");
    s.push_str("extern \"C\" {\n");
    for k in kernels {
        let _ = writeln!(
            s,
            "    fn ftn_emu_entry_{}(params: *const ::core::ffi::c_void);",
            k.name
        );
        let _ = writeln!(s, "    fn ftn_emu_params_size_{}() -> usize;", k.name);
    }
    s.push_str("}\n");
    for k in kernels {
        let _ = writeln!(
            s,
            "/// `{name}` from `cuda/{module}.cu`.\npub static {upper}: Kernel<crate::kernel_params::{params}> = Kernel::new(\"{name}\", \"{module}\", EmuEntry {{ run: ftn_emu_entry_{name}, params_size: ftn_emu_params_size_{name} }}){cluster};",
            cluster = if k.cluster > 1 {
                format!(".in_clusters_of({})", k.cluster)
            } else {
                String::new()
            },
            name = k.name,
            module = k.module,
            params = k.params,
            upper = k.name.to_uppercase()
        );
    }
    let mut params: Vec<&str> = kernels.iter().map(|k| k.params.as_str()).collect();
    params.sort_unstable();
    params.dedup();
    for p in params {
        let _ = writeln!(
            s,
            "// SAFETY: a repr(C) struct from cuda/params/ (bindgen): addresses, sizes, flags.\nunsafe impl KernelParams for crate::kernel_params::{p} {{}}"
        );
    }
    s.push_str("/// Every kernel, by name.\npub static ALL_KERNEL_NAMES: &[&str] = &[\n");
    for k in kernels {
        let _ = writeln!(s, "    \"{}\",", k.name);
    }
    s.push_str("];\n");
    s.push_str(
        "/// Every kernel as (name, module).\npub static ALL_KERNELS: &[(&str, &str)] = &[\n",
    );
    for k in kernels {
        let _ = writeln!(s, "    (\"{}\", \"{}\"),", k.name, k.module);
    }
    s.push_str("];\n");
    write_families(kernels, &mut s);
    std::fs::write(path, s).unwrap_or_else(|e| panic!("writing {path:?}: {e}"));
}

/// A family's kernels with their (variant, dtypes) keys.
type Members<'a> = Vec<(&'a KernelDecl, Option<u32>, Vec<&'static str>)>;

/// One `Family` static per family name, members in name order.
fn write_families(kernels: &[KernelDecl], s: &mut String) {
    let mut families: std::collections::BTreeMap<String, Members<'_>> = Default::default();
    for k in kernels {
        let (family, variant, dtypes) = family_key(&k.name);
        families
            .entry(family)
            .or_default()
            .push((k, variant, dtypes));
    }
    for (family, members) in &families {
        let params = &members[0].0.params;
        for (k, _, _) in members {
            assert!(
                &k.params == params,
                "kernel family {family}: {} takes {} but {} takes {params}; \
                 a family's kernels must share one parameter struct",
                k.name,
                k.params,
                members[0].0.name
            );
        }
        let _ = writeln!(
            s,
            "/// The `{family}` family: {n} kernel(s) keyed by (variant, dtypes).\npub static {upper}: Family<crate::kernel_params::{params}> = Family::new(\"{family}\", &[",
            n = members.len(),
            upper = family.to_uppercase()
        );
        for (k, variant, dtypes) in members {
            let variant = variant.map_or("None".to_string(), |v| format!("Some({v})"));
            let dtypes: Vec<String> = dtypes
                .iter()
                .map(|d| format!("crate::core::DType::{d}"))
                .collect();
            let _ = writeln!(
                s,
                "    Member {{ variant: {variant}, dtypes: &[{}], kernel: &{} }},",
                dtypes.join(", "),
                k.name.to_uppercase()
            );
        }
        s.push_str("]);\n");
    }
    s.push_str("/// The number of kernels in each family (a family-table self-check).\npub static ALL_FAMILY_SIZES: &[usize] = &[");
    for members in families.values() {
        let _ = write!(s, "{}, ", members.len());
    }
    s.push_str("];\n");
}
