//! Finds and loads NCCL (feature `cuda`). cudarc's own loader only tries
//! `libnccl.so` and `libnccl.so.{12,11,10,9,1}` on the default loader path,
//! so it never finds the `libnccl.so.2` that NVIDIA's pip wheels ship in
//! `site-packages/nvidia/nccl/lib`. Here the library is looked up, in order:
//!
//! 1. `FTN_NCCL_LIBRARY` (a file);
//! 2. `libnccl.so.2` / `libnccl.so` in each `LD_LIBRARY_PATH` folder, in
//!    `$CUDA_HOME` / `$CUDA_PATH` (`lib64`, `lib`), and in every Python
//!    site-packages folder's `nvidia/nccl/lib` (asked of `python3`, once);
//! 3. `libnccl.so.2` / `libnccl.so` through the system loader.
//!
//! The file that loaded is reported by [`library_path`]; when none loads, the
//! error lists every place tried and what to install.

use std::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

use cudarc::nccl::sys::{
    cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId,
};
use libloading::Library;

use crate::core::{Error, Result};

type Coll = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
type P2p<B> =
    unsafe extern "C" fn(B, usize, ncclDataType_t, c_int, ncclComm_t, cudaStream_t) -> ncclResult_t;

/// The NCCL entry points ferrotron calls, from one loaded library.
pub(crate) struct Nccl {
    /// The file that was loaded (or the name the system loader resolved).
    pub path: String,
    pub get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> ncclResult_t,
    pub comm_init_rank:
        unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> ncclResult_t,
    pub all_reduce: Coll,
    pub reduce_scatter: Coll,
    pub all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclComm_t,
        cudaStream_t,
    ) -> ncclResult_t,
    pub broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        cudaStream_t,
    ) -> ncclResult_t,
    pub send: P2p<*const c_void>,
    pub recv: P2p<*mut c_void>,
    pub group_start: unsafe extern "C" fn() -> ncclResult_t,
    pub group_end: unsafe extern "C" fn() -> ncclResult_t,
    pub comm_count: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> ncclResult_t,
    pub comm_user_rank: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> ncclResult_t,
    pub comm_split: unsafe extern "C" fn(
        ncclComm_t,
        c_int,
        c_int,
        *mut ncclComm_t,
        *mut c_void,
    ) -> ncclResult_t,
    pub comm_get_async_error: unsafe extern "C" fn(ncclComm_t, *mut ncclResult_t) -> ncclResult_t,
    pub comm_abort: unsafe extern "C" fn(ncclComm_t) -> ncclResult_t,
    pub comm_destroy: unsafe extern "C" fn(ncclComm_t) -> ncclResult_t,
    /// Keeps the functions above valid for the life of the process.
    _lib: Library,
}

const NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// What to do when NCCL is missing.
const HOW_TO_INSTALL: &str = "install it with `python3 -m pip install nvidia-nccl-cu13` \
     (CUDA 13 drivers; `nvidia-nccl-cu12` for CUDA 12), or point FTN_NCCL_LIBRARY at libnccl.so.2";

/// Python's site-packages folders (empty when there is no python3).
fn site_packages() -> Vec<PathBuf> {
    let script = "import site, sys\n\
        dirs = list(getattr(site, 'getsitepackages', lambda: [])())\n\
        dirs.append(site.getusersitepackages())\n\
        dirs += [p for p in sys.path if p.endswith('site-packages')]\n\
        print('\\n'.join(dirs))";
    std::process::Command::new("python3")
        .args(["-c", script])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default()
}

/// The folders to search before asking Python: `LD_LIBRARY_PATH`, then
/// `$CUDA_HOME` / `$CUDA_PATH` (`lib64`, `lib`).
fn env_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            let root = PathBuf::from(root);
            dirs.push(root.join("lib64"));
            dirs.push(root.join("lib"));
        }
    }
    dirs
}

/// The NCCL files present in `dirs`, in order.
fn files_in(dirs: &[PathBuf]) -> Vec<String> {
    dirs.iter()
        .flat_map(|d| NAMES.iter().map(move |n| d.join(n)))
        .filter(|f| f.is_file())
        .map(|f| f.to_string_lossy().into_owned())
        .collect()
}

/// `dlsym` of one symbol as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the C signature of `name` in NCCL's `nccl.h`.
unsafe fn sym<F: Copy>(lib: &Library, name: &str) -> std::result::Result<F, String> {
    // SAFETY: forwarded contract; the pointer stays valid while `lib` lives,
    // and Nccl keeps `lib` for the life of the process.
    unsafe { lib.get::<F>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("{name}: {e}"))
}

fn load(path: String) -> std::result::Result<Nccl, String> {
    // SAFETY: loading NCCL runs its initialisers, which have no
    // preconditions.
    let lib = unsafe { Library::new(&path) }.map_err(|e| format!("{path}: {e}"))?;
    // SAFETY (each sym): the types are nccl.h's signatures, as bound by cudarc.
    unsafe {
        Ok(Nccl {
            get_unique_id: sym(&lib, "ncclGetUniqueId")?,
            comm_init_rank: sym(&lib, "ncclCommInitRank")?,
            all_reduce: sym(&lib, "ncclAllReduce")?,
            reduce_scatter: sym(&lib, "ncclReduceScatter")?,
            all_gather: sym(&lib, "ncclAllGather")?,
            broadcast: sym(&lib, "ncclBroadcast")?,
            send: sym(&lib, "ncclSend")?,
            recv: sym(&lib, "ncclRecv")?,
            group_start: sym(&lib, "ncclGroupStart")?,
            group_end: sym(&lib, "ncclGroupEnd")?,
            comm_count: sym(&lib, "ncclCommCount")?,
            comm_user_rank: sym(&lib, "ncclCommUserRank")?,
            comm_split: sym(&lib, "ncclCommSplit")?,
            comm_get_async_error: sym(&lib, "ncclCommGetAsyncError")?,
            comm_abort: sym(&lib, "ncclCommAbort")?,
            comm_destroy: sym(&lib, "ncclCommDestroy")?,
            path,
            _lib: lib,
        })
    }
}

/// NCCL, loaded on first use (once per process).
pub(crate) fn nccl() -> Result<&'static Nccl> {
    static NCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    NCCL.get_or_init(|| {
        // Cheapest first: python3 is only asked when nothing else loads.
        let mut tried = Vec::new();
        let mut try_all = |files: Vec<String>| {
            for f in files {
                match load(f) {
                    Ok(n) => return Some(n),
                    Err(e) => tried.push(e),
                }
            }
            None
        };
        let explicit: Vec<String> = std::env::var("FTN_NCCL_LIBRARY").into_iter().collect();
        if let Some(n) = try_all(explicit) {
            return Ok(n);
        }
        let mut dirs = env_dirs();
        if let Some(n) = try_all(files_in(&dirs)) {
            return Ok(n);
        }
        let mut python: Vec<PathBuf> = Vec::new();
        for d in site_packages()
            .into_iter()
            .map(|s| s.join("nvidia/nccl/lib"))
        {
            if !dirs.contains(&d) && !python.contains(&d) {
                python.push(d);
            }
        }
        if let Some(n) = try_all(files_in(&python)) {
            return Ok(n);
        }
        if let Some(n) = try_all(NAMES.iter().map(|n| n.to_string()).collect()) {
            return Ok(n);
        }
        dirs.extend(python);
        let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        let searched = if searched.is_empty() {
            "none (LD_LIBRARY_PATH, CUDA_HOME and CUDA_PATH unset, no python3 site-packages)".into()
        } else {
            searched.join(", ")
        };
        Err(format!(
            "NCCL was not found; {HOW_TO_INSTALL}. Folders searched: {searched}. Loads tried: {}",
            tried.join("; ")
        ))
    })
    .as_ref()
    .map_err(|reason| Error::BackendUnavailable {
        backend: "nccl",
        reason: reason.clone(),
    })
}

/// The NCCL library file ferrotron loaded, loading it if needed; an error
/// listing every place searched when there is none.
pub fn library_path() -> Result<String> {
    nccl().map(|n| n.path.clone())
}

/// `Ok` for `ncclSuccess`, else an error naming the call.
pub(crate) fn check(what: &str, r: ncclResult_t) -> Result<()> {
    if r == ncclResult_t::ncclSuccess {
        Ok(())
    } else {
        Err(Error::Backend {
            backend: "nccl",
            message: format!("{what}: {r:?}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CI installs the `nvidia-nccl-cu13` wheel where pip puts it and sets
    /// FTN_EXPECT_NCCL=1: the search must find it there, as on a GPU machine
    /// (loading and resolving every symbol needs no GPU).
    #[test]
    fn finds_the_wheel_when_ci_installed_it() {
        if std::env::var("FTN_EXPECT_NCCL").is_ok_and(|v| v == "1") {
            let p = library_path().unwrap();
            assert!(p.ends_with("nvidia/nccl/lib/libnccl.so.2"), "{p}");
        }
    }

    #[test]
    fn a_missing_library_names_what_to_install() {
        // Whatever this machine has, the search itself never panics, and
        // when nothing loads the error says what to install.
        match library_path() {
            Ok(p) => assert!(p.contains("nccl"), "{p}"),
            Err(e) => {
                let m = e.to_string();
                assert!(
                    m.contains("nvidia-nccl-cu13") && m.contains("FTN_NCCL_LIBRARY"),
                    "{m}"
                );
            }
        }
    }
}
