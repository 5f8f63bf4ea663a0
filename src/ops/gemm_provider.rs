//! Which implementation runs a [`Gemm`](super::gemm::Gemm): ferrotron's
//! tensor-core kernel or NVIDIA's cuBLASLt (docs/perf.md, "GEMM providers").
//!
//! Everything here is pure and runs on the emulator: the decision (measured
//! times per provider -> choice, [`decide`]), the resolution of what the user
//! asked for against what the backend offers ([`resolve`]), the per-process
//! cache keyed by [`GemmKey`] that measures each key once
//! ([`ProviderCache::choose`]), and its optional file
//! (`FTN_GEMM_PROVIDER_CACHE=path`). Measuring itself needs a GPU and is done
//! by the caller through the closure given to `choose`, so tests inject
//! timings.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::backend::BackendKind;
use crate::core::activation::{Epilogue, Gelu};
use crate::core::{DType, Result};
use crate::Error;

const OP: &str = "gemm";

/// Environment variable that overrides [`GemmProvider::Auto`]:
/// `auto`, `ferrotron` or `cublaslt`.
pub const ENV_PROVIDER: &str = "FTN_GEMM_PROVIDER";
/// Environment variable naming the file that persists measured choices.
pub const ENV_CACHE: &str = "FTN_GEMM_PROVIDER_CACHE";
/// Environment variable that, when set (non-empty, not `0`), logs one line
/// per key to stderr when a choice is made.
pub const ENV_LOG: &str = "FTN_LOG";

/// cuBLASLt must be faster than ferrotron by more than this fraction of
/// ferrotron's time to be chosen (measurement noise must not flip choices).
pub const DEFAULT_MARGIN: f64 = 0.05;

/// First line of the cache file.
const FILE_HEADER: &str = "# ferrotron gemm provider cache v1";

/// What the user asks for (on the op, or through `FTN_GEMM_PROVIDER`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GemmProvider {
    /// The faster of the two for this key, measured once per process (or
    /// read from the cache file); ferrotron where cuBLASLt cannot run.
    #[default]
    Auto,
    /// Always ferrotron's kernel.
    Ferrotron,
    /// Always cuBLASLt; an error where it cannot run.
    CublasLt,
}

impl GemmProvider {
    /// Parses `auto`, `ferrotron` or `cublaslt` (case-insensitive).
    pub fn parse(s: &str) -> Result<GemmProvider> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(GemmProvider::Auto),
            "ferrotron" => Ok(GemmProvider::Ferrotron),
            "cublaslt" => Ok(GemmProvider::CublasLt),
            _ => Err(Error::invalid(
                OP,
                ENV_PROVIDER,
                "auto, ferrotron or cublaslt",
                s,
            )),
        }
    }

    /// `FTN_GEMM_PROVIDER`, if set.
    pub fn from_env() -> Result<Option<GemmProvider>> {
        match std::env::var(ENV_PROVIDER) {
            Ok(v) => GemmProvider::parse(&v).map(Some),
            Err(_) => Ok(None),
        }
    }
}

/// The implementation that runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Provider {
    Ferrotron,
    CublasLt,
}

impl Provider {
    pub fn name(self) -> &'static str {
        match self {
            Provider::Ferrotron => "ferrotron",
            Provider::CublasLt => "cublaslt",
        }
    }
    fn parse(s: &str) -> Option<Provider> {
        match s {
            "ferrotron" => Some(Provider::Ferrotron),
            "cublaslt" => Some(Provider::CublasLt),
            _ => None,
        }
    }
}

/// Why a provider was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The emulator runs only ferrotron's kernels.
    Emulator,
    /// Set on the op.
    Requested,
    /// Set by `FTN_GEMM_PROVIDER`.
    Env,
    /// Auto, but cuBLASLt cannot run here (the text says why, e.g. the
    /// library is missing).
    CublasLtUnavailable(String),
    /// Auto, but cuBLASLt cannot express this GEMM (the text says what).
    NotExpressible(&'static str),
    /// Auto, but the op sets options only ferrotron's kernel has (a forced
    /// tile, or `fast_path = false`).
    FerrotronOptions,
    /// Auto: measured in this process (or read from the cache file).
    Measured,
    /// Auto, not measured yet: what [`resolve`] returns before measuring.
    NeedsMeasurement,
}

/// Which provider runs (or would run) a GEMM, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    pub provider: Provider,
    pub reason: Reason,
}

/// The cache key: shape, dtypes, transposes, epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmKey {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub input: DType,
    pub output: DType,
    pub trans_a: bool,
    pub trans_b: bool,
    pub epilogue: Epilogue,
}

fn epilogue_name(e: Epilogue) -> &'static str {
    match e {
        Epilogue::None => "none",
        Epilogue::Bias => "bias",
        Epilogue::BiasGelu(Gelu::Tanh) => "bias_gelu_tanh",
        Epilogue::BiasGelu(Gelu::Erf) => "bias_gelu_erf",
        Epilogue::DGelu(Gelu::Tanh) => "dgelu_tanh",
        Epilogue::DGelu(Gelu::Erf) => "dgelu_erf",
    }
}

fn parse_epilogue(s: &str) -> Option<Epilogue> {
    Some(match s {
        "none" => Epilogue::None,
        "bias" => Epilogue::Bias,
        "bias_gelu_tanh" => Epilogue::BiasGelu(Gelu::Tanh),
        "bias_gelu_erf" => Epilogue::BiasGelu(Gelu::Erf),
        "dgelu_tanh" => Epilogue::DGelu(Gelu::Tanh),
        "dgelu_erf" => Epilogue::DGelu(Gelu::Erf),
        _ => return None,
    })
}

fn parse_dtype(s: &str) -> Option<DType> {
    [DType::F16, DType::BF16, DType::F32]
        .into_iter()
        .find(|d| d.name() == s)
}

impl core::fmt::Display for GemmKey {
    /// `m n k batch input output trans_a trans_b epilogue`, the cache file's
    /// format (without the provider).
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} {} {} {} {} {} {} {} {}",
            self.m,
            self.n,
            self.k,
            self.batch,
            self.input,
            self.output,
            self.trans_a as u8,
            self.trans_b as u8,
            epilogue_name(self.epilogue)
        )
    }
}

impl GemmKey {
    /// Whether cuBLASLt can compute this GEMM with the same semantics:
    /// `Err` names what it cannot express. cuBLASLt's GELU epilogues are
    /// the tanh form only; its bias and aux types follow the output type, so
    /// epilogues need the output in the input type.
    pub fn cublaslt_expressible(&self) -> std::result::Result<(), &'static str> {
        match self.epilogue {
            Epilogue::BiasGelu(Gelu::Erf) | Epilogue::DGelu(Gelu::Erf) => {
                Err("erf GeLU (cuBLASLt's GELU epilogues are the tanh form)")
            }
            Epilogue::None => Ok(()),
            _ if self.output != self.input => {
                Err("a bias/GeLU epilogue with an output type other than the input type")
            }
            _ => Ok(()),
        }
    }
}

/// Measured time per call of each provider for one key, in milliseconds;
/// `cublaslt_ms = None` when cuBLASLt could not be measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timings {
    pub ferrotron_ms: f64,
    pub cublaslt_ms: Option<f64>,
}

/// cuBLASLt only when it is faster than ferrotron by more than `margin` (a
/// fraction of ferrotron's time); ties, non-finite or missing times ->
/// ferrotron.
pub fn decide(t: Timings, margin: f64) -> Provider {
    match t.cublaslt_ms {
        Some(c)
            if c.is_finite()
                && c > 0.0
                && (!t.ferrotron_ms.is_finite()
                    || c < t.ferrotron_ms * (1.0 - margin.clamp(0.0, 1.0))) =>
        {
            Provider::CublasLt
        }
        _ => Provider::Ferrotron,
    }
}

/// Resolves the request against the backend: a fixed [`Selection`], or
/// `reason: NeedsMeasurement` (provider ferrotron until measured) when Auto
/// must measure. `op` is the op's own setting, `env` `FTN_GEMM_PROVIDER`
/// (used only when the op says Auto); `cublaslt` is whether the library
/// loaded (`Err` says why not).
pub fn resolve(
    op: GemmProvider,
    env: Option<GemmProvider>,
    backend: BackendKind,
    cublaslt: std::result::Result<(), String>,
    key: &GemmKey,
) -> Result<Selection> {
    let (want, explicit_reason) = match (op, env) {
        (GemmProvider::Auto, Some(e)) => (e, Reason::Env),
        (o, _) => (o, Reason::Requested),
    };
    let sel = |provider, reason| Ok(Selection { provider, reason });
    match want {
        GemmProvider::Ferrotron => sel(Provider::Ferrotron, explicit_reason),
        GemmProvider::CublasLt => {
            if backend == BackendKind::Emu {
                return Err(Error::BackendUnavailable {
                    backend: "cublaslt",
                    reason: "the emulator runs only ferrotron's GEMM; use GemmProvider::Auto \
                             or Ferrotron, or a CUDA device"
                        .into(),
                });
            }
            if let Err(why) = cublaslt {
                return Err(Error::BackendUnavailable {
                    backend: "cublaslt",
                    reason: why,
                });
            }
            if let Err(what) = key.cublaslt_expressible() {
                return Err(Error::invalid(
                    OP,
                    "provider",
                    format!("a GEMM cuBLASLt can express (not {what})"),
                    "GemmProvider::CublasLt",
                ));
            }
            sel(Provider::CublasLt, explicit_reason)
        }
        GemmProvider::Auto => {
            if backend == BackendKind::Emu {
                return sel(Provider::Ferrotron, Reason::Emulator);
            }
            if let Err(why) = cublaslt {
                return sel(Provider::Ferrotron, Reason::CublasLtUnavailable(why));
            }
            if let Err(what) = key.cublaslt_expressible() {
                return sel(Provider::Ferrotron, Reason::NotExpressible(what));
            }
            sel(Provider::Ferrotron, Reason::NeedsMeasurement)
        }
    }
}

/// Reads a cache file: `Err` describes why it is unusable (the caller warns
/// and ignores it).
pub fn load_file(path: &Path) -> std::result::Result<HashMap<GemmKey, Provider>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text.lines();
    if lines.next() != Some(FILE_HEADER) {
        return Err(format!(
            "{}: not a ferrotron GEMM provider cache (first line is not {FILE_HEADER:?})",
            path.display()
        ));
    }
    let mut map = HashMap::new();
    for (i, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || format!("{}:{}: unreadable entry {line:?}", path.display(), i + 2);
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 10 {
            return Err(bad());
        }
        let num = |s: &str| s.parse::<usize>().map_err(|_| bad());
        let flag = |s: &str| match s {
            "0" => Ok(false),
            "1" => Ok(true),
            _ => Err(bad()),
        };
        let key = GemmKey {
            m: num(f[0])?,
            n: num(f[1])?,
            k: num(f[2])?,
            batch: num(f[3])?,
            input: parse_dtype(f[4]).ok_or_else(bad)?,
            output: parse_dtype(f[5]).ok_or_else(bad)?,
            trans_a: flag(f[6])?,
            trans_b: flag(f[7])?,
            epilogue: parse_epilogue(f[8]).ok_or_else(bad)?,
        };
        map.insert(key, Provider::parse(f[9]).ok_or_else(bad)?);
    }
    Ok(map)
}

/// Writes a cache file (through a temporary file and a rename).
pub fn save_file(path: &Path, map: &HashMap<GemmKey, Provider>) -> Result<()> {
    let mut lines: Vec<String> = map
        .iter()
        .map(|(k, p)| format!("{k} {}", p.name()))
        .collect();
    lines.sort();
    let mut text = String::from(FILE_HEADER);
    text.push('\n');
    for l in lines {
        text.push_str(&l);
        text.push('\n');
    }
    let io = |e: std::io::Error| {
        Error::invalid(
            OP,
            ENV_CACHE,
            "a writable path",
            format!("{}: {e}", path.display()),
        )
    };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Measured choices per key. One per process ([`ProviderCache::global`]);
/// tests make their own.
pub struct ProviderCache {
    entries: Mutex<HashMap<GemmKey, Provider>>,
    path: Option<PathBuf>,
    margin: f64,
    measurements: AtomicUsize,
    logged: Mutex<HashSet<GemmKey>>,
    log: bool,
}

impl ProviderCache {
    /// An empty in-memory cache.
    pub fn new(margin: f64) -> ProviderCache {
        ProviderCache {
            entries: Mutex::new(HashMap::new()),
            path: None,
            margin,
            measurements: AtomicUsize::new(0),
            logged: Mutex::new(HashSet::new()),
            log: false,
        }
    }

    /// A cache backed by `path`: loaded now (a missing file is an empty
    /// cache; an unreadable one is ignored, and the returned warning says
    /// why), rewritten after each new measurement.
    pub fn with_file(path: impl Into<PathBuf>, margin: f64) -> (ProviderCache, Option<String>) {
        let path = path.into();
        let (map, warning) = if path.exists() {
            match load_file(&path) {
                Ok(m) => (m, None),
                Err(e) => (
                    HashMap::new(),
                    Some(format!("ignoring the cache file: {e}")),
                ),
            }
        } else {
            (HashMap::new(), None)
        };
        let mut c = ProviderCache::new(margin);
        c.entries = Mutex::new(map);
        c.path = Some(path);
        (c, warning)
    }

    /// Logs one line per key (stderr) when a choice is first used.
    pub fn with_log(self, log: bool) -> ProviderCache {
        ProviderCache { log, ..self }
    }

    /// The process-wide cache: `FTN_GEMM_PROVIDER_CACHE` and `FTN_LOG` read
    /// once, on first use; a warning about the file goes to stderr.
    pub fn global() -> &'static ProviderCache {
        static CACHE: OnceLock<ProviderCache> = OnceLock::new();
        CACHE.get_or_init(|| {
            let log = std::env::var(ENV_LOG).is_ok_and(|v| !v.is_empty() && v != "0");
            let cache = match std::env::var_os(ENV_CACHE) {
                Some(p) if !p.is_empty() => {
                    let (c, warning) = ProviderCache::with_file(PathBuf::from(p), DEFAULT_MARGIN);
                    if let Some(w) = warning {
                        eprintln!("[ferrotron] gemm provider: {w}");
                    }
                    c
                }
                _ => ProviderCache::new(DEFAULT_MARGIN),
            };
            cache.with_log(log)
        })
    }

    /// The cached choice for `key`, if any.
    pub fn get(&self, key: &GemmKey) -> Option<Provider> {
        self.lock().get(key).copied()
    }

    /// How many times `choose` has measured.
    pub fn measurements(&self) -> usize {
        self.measurements.load(Ordering::Relaxed)
    }

    /// The number of cached keys.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<GemmKey, Provider>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The choice for `key`: cached, or measured now with `measure` (called
    /// at most once per key and process, under the cache's lock so
    /// concurrent first calls measure once) and [`decide`]d. A failure to
    /// write the file is a warning, not an error.
    pub fn choose(
        &self,
        key: &GemmKey,
        measure: impl FnOnce() -> Result<Timings>,
    ) -> Result<Provider> {
        let mut map = self.lock();
        if let Some(&p) = map.get(key) {
            drop(map);
            self.log_once(key, p, None);
            return Ok(p);
        }
        let t = measure()?;
        self.measurements.fetch_add(1, Ordering::Relaxed);
        let p = decide(t, self.margin);
        map.insert(*key, p);
        if let Some(path) = &self.path {
            if let Err(e) = save_file(path, &map) {
                eprintln!("[ferrotron] gemm provider: not saving the cache file: {e}");
            }
        }
        drop(map);
        self.log_once(key, p, Some(t));
        Ok(p)
    }

    /// Logs a selection once per key (when logging is on).
    pub fn log_once(&self, key: &GemmKey, p: Provider, t: Option<Timings>) {
        if !self.log {
            return;
        }
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged.insert(*key) {
            let how = match t {
                Some(t) => format!(
                    " (measured: ferrotron {:.4} ms, cublaslt {})",
                    t.ferrotron_ms,
                    t.cublaslt_ms
                        .map_or("n/a".to_string(), |c| format!("{c:.4} ms"))
                ),
                None => String::new(),
            };
            eprintln!("[ferrotron] gemm [{key}] -> {}{how}", p.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_epilogue_round_trips_through_its_name() {
        for e in [
            Epilogue::None,
            Epilogue::Bias,
            Epilogue::BiasGelu(Gelu::Tanh),
            Epilogue::BiasGelu(Gelu::Erf),
            Epilogue::DGelu(Gelu::Tanh),
            Epilogue::DGelu(Gelu::Erf),
        ] {
            assert_eq!(parse_epilogue(epilogue_name(e)), Some(e));
        }
    }
}
