//! The GEMM provider switch (docs/perf.md, "GEMM providers"): the decision
//! from injected timings (margin, ties, missing or non-finite times), the
//! resolution of op / env requests against the backend, the per-key cache
//! (measured once), its file (round trip, corrupted file ignored with a
//! warning), the emulator always running ferrotron, and every provider that
//! can run agreeing with the float64 oracle.

mod common;

use common::{assert_close, devices, to_f64, Rng};
use ferrotron::backend::BackendKind;
use ferrotron::core::DType;
use ferrotron::ops::gemm::{Aux, Epilogue, Gemm, GemmInputs};
use ferrotron::ops::gemm_provider::{
    decide, load_file, resolve, GemmKey, GemmProvider, Provider, ProviderCache, Reason, Timings,
    DEFAULT_MARGIN,
};
use ferrotron::ops::Gelu;
use ferrotron::reference::gemm::{self as oracle, Mat, Problem};
use ferrotron::{Device, Error};
use half::bf16;

/// Held by every test that reads or sets `FTN_GEMM_PROVIDER` (through
/// `Gemm::selection` / `run`), so the env test cannot race them.
static ENV_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn env_lock() -> std::sync::MutexGuard<'static, ()> {
    ENV_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn key(m: usize, epilogue: Epilogue) -> GemmKey {
    GemmKey {
        m,
        n: 64,
        k: 32,
        batch: 1,
        input: DType::BF16,
        output: DType::BF16,
        trans_a: false,
        trans_b: true,
        epilogue,
    }
}

fn t(f: f64, c: Option<f64>) -> Timings {
    Timings {
        ferrotron_ms: f,
        cublaslt_ms: c,
    }
}

#[test]
fn decision_needs_a_margin_and_ties_go_to_ferrotron() {
    let m = 0.05;
    assert_eq!(decide(t(1.0, Some(0.5)), m), Provider::CublasLt);
    assert_eq!(decide(t(1.0, Some(0.94)), m), Provider::CublasLt);
    // Within the margin (and exact ties): ferrotron.
    assert_eq!(decide(t(1.0, Some(0.96)), m), Provider::Ferrotron);
    assert_eq!(decide(t(1.0, Some(1.0)), 0.0), Provider::Ferrotron);
    assert_eq!(decide(t(1.0, Some(2.0)), m), Provider::Ferrotron);
    // cuBLASLt not measured or nonsense: ferrotron.
    assert_eq!(decide(t(1.0, None), m), Provider::Ferrotron);
    assert_eq!(decide(t(1.0, Some(f64::NAN)), m), Provider::Ferrotron);
    assert_eq!(decide(t(1.0, Some(0.0)), m), Provider::Ferrotron);
    // Ferrotron failed to time (infinite) but cuBLASLt did.
    assert_eq!(decide(t(f64::INFINITY, Some(1.0)), m), Provider::CublasLt);
}

#[test]
fn resolution_of_requests_against_the_backend() {
    let k = key(128, Epilogue::BiasGelu(Gelu::Tanh));
    let ok = || Ok(());
    let missing = || Err("libcublasLt.so.13 not found (pip install nvidia-cublas)".to_string());
    // Emulator: Auto is ferrotron, explicit cuBLASLt a named error.
    let s = resolve(GemmProvider::Auto, None, BackendKind::Emu, ok(), &k).unwrap();
    assert_eq!(
        (s.provider, s.reason),
        (Provider::Ferrotron, Reason::Emulator)
    );
    let e = resolve(GemmProvider::CublasLt, None, BackendKind::Emu, ok(), &k).unwrap_err();
    assert!(
        matches!(
            e,
            Error::BackendUnavailable {
                backend: "cublaslt",
                ..
            }
        ),
        "{e}"
    );
    // CUDA, library missing: Auto silently ferrotron (saying why),
    // explicit an error that names what to install.
    let s = resolve(GemmProvider::Auto, None, BackendKind::Cuda, missing(), &k).unwrap();
    assert_eq!(s.provider, Provider::Ferrotron);
    assert!(matches!(s.reason, Reason::CublasLtUnavailable(ref w) if w.contains("nvidia-cublas")));
    let e = resolve(
        GemmProvider::CublasLt,
        None,
        BackendKind::Cuda,
        missing(),
        &k,
    )
    .unwrap_err();
    assert!(e.to_string().contains("libcublasLt.so.13"), "{e}");
    // CUDA, library present: Auto measures, explicit choices win.
    let s = resolve(GemmProvider::Auto, None, BackendKind::Cuda, ok(), &k).unwrap();
    assert_eq!(s.reason, Reason::NeedsMeasurement);
    let s = resolve(GemmProvider::CublasLt, None, BackendKind::Cuda, ok(), &k).unwrap();
    assert_eq!(
        (s.provider, s.reason),
        (Provider::CublasLt, Reason::Requested)
    );
    // Env applies only when the op says Auto.
    let env = Some(GemmProvider::CublasLt);
    let s = resolve(GemmProvider::Auto, env, BackendKind::Cuda, ok(), &k).unwrap();
    assert_eq!((s.provider, s.reason), (Provider::CublasLt, Reason::Env));
    let s = resolve(GemmProvider::Ferrotron, env, BackendKind::Cuda, ok(), &k).unwrap();
    assert_eq!(
        (s.provider, s.reason),
        (Provider::Ferrotron, Reason::Requested)
    );
    let env = Some(GemmProvider::Ferrotron);
    let s = resolve(GemmProvider::Auto, env, BackendKind::Cuda, ok(), &k).unwrap();
    assert_eq!((s.provider, s.reason), (Provider::Ferrotron, Reason::Env));
    // Not expressible in cuBLASLt: erf GeLU; epilogue with an fp32 output.
    let erf = key(128, Epilogue::BiasGelu(Gelu::Erf));
    let s = resolve(GemmProvider::Auto, None, BackendKind::Cuda, ok(), &erf).unwrap();
    assert!(matches!(s.reason, Reason::NotExpressible(_)));
    let e = resolve(GemmProvider::CublasLt, None, BackendKind::Cuda, ok(), &erf).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let f32_bias = GemmKey {
        output: DType::F32,
        ..key(128, Epilogue::Bias)
    };
    assert!(f32_bias.cublaslt_expressible().is_err());
    let f32_plain = GemmKey {
        output: DType::F32,
        ..key(128, Epilogue::None)
    };
    assert!(f32_plain.cublaslt_expressible().is_ok());
}

#[test]
fn ferrotron_only_options_keep_auto_on_ferrotron() {
    let _env = env_lock();
    use ferrotron::core::plan::gemm::GemmTile;
    let dev = Device::emu();
    let op = Gemm::new(8, 8, 8).tile(Some(GemmTile::T64x64));
    let s = op.selection::<bf16, bf16>(&dev).unwrap();
    assert_eq!(
        (s.provider, s.reason),
        (Provider::Ferrotron, Reason::FerrotronOptions)
    );
    let s = Gemm::new(8, 8, 8)
        .fast_path(false)
        .selection::<bf16, bf16>(&dev)
        .unwrap();
    assert_eq!(s.reason, Reason::FerrotronOptions);
    let s = Gemm::new(8, 8, 8).selection::<bf16, bf16>(&dev).unwrap();
    assert_eq!(
        (s.provider, s.reason),
        (Provider::Ferrotron, Reason::Emulator)
    );
}

#[test]
fn env_override_applies_to_auto_only() {
    use ferrotron::ops::gemm_provider::ENV_PROVIDER;
    let _env = env_lock();
    let dev = Device::emu();
    let auto = Gemm::new(8, 8, 8);
    std::env::set_var(ENV_PROVIDER, "ferrotron");
    let s = auto.selection::<bf16, bf16>(&dev).unwrap();
    assert_eq!((s.provider, s.reason), (Provider::Ferrotron, Reason::Env));
    // cuBLASLt on the emulator: a named error, from the query and from run.
    std::env::set_var(ENV_PROVIDER, "cublaslt");
    let e = auto.selection::<bf16, bf16>(&dev).unwrap_err();
    assert!(
        matches!(
            e,
            Error::BackendUnavailable {
                backend: "cublaslt",
                ..
            }
        ),
        "{e}"
    );
    // The op's explicit setting wins over the env.
    let s = auto
        .provider(GemmProvider::Ferrotron)
        .selection::<bf16, bf16>(&dev)
        .unwrap();
    assert_eq!(s.reason, Reason::Requested);
    std::env::set_var(ENV_PROVIDER, "fastest");
    assert!(matches!(
        auto.selection::<bf16, bf16>(&dev),
        Err(Error::InvalidArgument { .. })
    ));
    std::env::remove_var(ENV_PROVIDER);
    let s = auto.selection::<bf16, bf16>(&dev).unwrap();
    assert_eq!(s.reason, Reason::Emulator);
}

#[test]
fn env_values_parse() {
    assert_eq!(GemmProvider::parse("auto").unwrap(), GemmProvider::Auto);
    assert_eq!(
        GemmProvider::parse(" CuBLASLt ").unwrap(),
        GemmProvider::CublasLt
    );
    assert_eq!(
        GemmProvider::parse("ferrotron").unwrap(),
        GemmProvider::Ferrotron
    );
    assert!(matches!(
        GemmProvider::parse("cublas"),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn cache_measures_each_key_once() {
    let cache = ProviderCache::new(DEFAULT_MARGIN);
    let (a, b) = (key(128, Epilogue::None), key(256, Epilogue::None));
    let p = cache.choose(&a, || Ok(t(1.0, Some(0.5)))).unwrap();
    assert_eq!(p, Provider::CublasLt);
    // Cached: the measurement is not repeated (it would now say ferrotron).
    let p = cache
        .choose(&a, || -> ferrotron::Result<Timings> {
            panic!("measured twice")
        })
        .unwrap();
    assert_eq!(p, Provider::CublasLt);
    assert_eq!(
        cache.choose(&b, || Ok(t(1.0, Some(1.0)))).unwrap(),
        Provider::Ferrotron
    );
    assert_eq!(cache.measurements(), 2);
    assert_eq!(cache.len(), 2);
    // A failed measurement caches nothing and is reported.
    let c = key(512, Epilogue::None);
    assert!(cache
        .choose(&c, || Err(Error::invalid("gemm", "x", "y", "z")))
        .is_err());
    assert_eq!(cache.get(&c), None);
}

fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("ftn-gemm-provider-{}-{name}", std::process::id()))
}

#[test]
fn cache_file_round_trip() {
    let path = temp_path("roundtrip");
    let _ = std::fs::remove_file(&path);
    let keys = [
        key(128, Epilogue::None),
        key(256, Epilogue::BiasGelu(Gelu::Tanh)),
        GemmKey {
            trans_a: true,
            trans_b: false,
            batch: 3,
            output: DType::F32,
            ..key(64, Epilogue::DGelu(Gelu::Erf))
        },
    ];
    {
        let (cache, warning) = ProviderCache::with_file(&path, DEFAULT_MARGIN);
        assert_eq!(warning, None);
        assert!(cache.is_empty());
        cache.choose(&keys[0], || Ok(t(1.0, Some(0.1)))).unwrap();
        cache.choose(&keys[1], || Ok(t(1.0, Some(3.0)))).unwrap();
        cache.choose(&keys[2], || Ok(t(1.0, None))).unwrap();
    }
    let (cache, warning) = ProviderCache::with_file(&path, DEFAULT_MARGIN);
    assert_eq!(warning, None);
    assert_eq!(cache.get(&keys[0]), Some(Provider::CublasLt));
    assert_eq!(cache.get(&keys[1]), Some(Provider::Ferrotron));
    assert_eq!(cache.get(&keys[2]), Some(Provider::Ferrotron));
    // Read back from the file: nothing is measured again.
    for k in &keys {
        cache
            .choose(k, || -> ferrotron::Result<Timings> {
                panic!("measured again")
            })
            .unwrap();
    }
    assert_eq!(cache.measurements(), 0);
    assert_eq!(load_file(&path).unwrap().len(), 3);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn corrupted_cache_file_is_ignored_with_a_warning() {
    let path = temp_path("corrupt");
    for text in [
        "garbage\n",
        "# ferrotron gemm provider cache v1\n128 64 32 1 bf16 bf16 0 1 none fastest\n",
        "# ferrotron gemm provider cache v1\n128 64 32\n",
        "# ferrotron gemm provider cache v1\n128 64 32 1 f99 bf16 0 1 none cublaslt\n",
    ] {
        std::fs::write(&path, text).unwrap();
        let (cache, warning) = ProviderCache::with_file(&path, DEFAULT_MARGIN);
        let w = warning.expect("a warning");
        assert!(w.contains("ignoring"), "{w}");
        assert!(cache.is_empty());
        // Still usable, and rewrites the file in the right format.
        let k = key(128, Epilogue::None);
        cache.choose(&k, || Ok(t(1.0, Some(0.1)))).unwrap();
        assert_eq!(load_file(&path).unwrap().get(&k), Some(&Provider::CublasLt));
    }
    std::fs::write(&path, [0xffu8, 0xfe, 0x00]).unwrap();
    assert!(ProviderCache::with_file(&path, DEFAULT_MARGIN).1.is_some());
    std::fs::remove_file(&path).unwrap();
}

/// One GEMM (packed, bf16 in and out, `beta` into a separate C) against
/// the oracle; the pre-activation too when the epilogue stores it.
fn check_against_oracle(dev: &Device, op: Gemm) -> ferrotron::Result<()> {
    let (m, n, k, batch) = (op.m, op.n, op.k, op.batch);
    let (mut rng, seed) = Rng::new((m * 7919 + n * 31 + k + batch) as u64);
    let stream = dev.new_stream()?;
    let (a, af) = rng.tensor::<bf16>(batch * m * k, 1.0);
    let (b, bf) = rng.tensor::<bf16>(batch * n * k, 0.2);
    let (c, cf) = rng.tensor::<bf16>(batch * m * n, 1.0);
    let (bias, biasf) = rng.tensor::<bf16>(n, 0.5);
    let (pre_in, pre_inf) = rng.tensor::<bf16>(batch * m * n, 1.0);
    let (ad, bd, biasd) = (dev.upload(&a)?, dev.upload(&b)?, dev.upload(&bias)?);
    let cd = dev.upload(&c)?;
    let mut y = dev.alloc_zeros::<bf16>(batch * m * n)?;
    let mut pre = dev.alloc_zeros::<bf16>(batch * m * n)?;
    let pre_d = dev.upload(&pre_in)?;
    let with_bias = matches!(op.epilogue, Epilogue::Bias | Epilogue::BiasGelu(_));
    let store = matches!(op.epilogue, Epilogue::BiasGelu(_));
    let aux = match op.epilogue {
        Epilogue::BiasGelu(_) => Aux::Store(&mut pre),
        Epilogue::DGelu(_) => Aux::PreActivation(&pre_d),
        _ => Aux::None,
    };
    op.run(
        &stream,
        GemmInputs {
            a: &ad,
            b: &bd,
            bias: with_bias.then_some(&biasd),
            c: (op.beta != 0.0).then_some(&cd),
        },
        aux,
        &mut y,
    )?;
    stream.synchronize()?;
    let p = Problem {
        m,
        n,
        k,
        batch,
        trans_a: op.trans_a,
        trans_b: op.trans_b,
        alpha: op.alpha as f64,
        beta: op.beta as f64,
        epilogue: op.epilogue,
    };
    let (ra, ca) = if op.trans_a { (k, m) } else { (m, k) };
    let cb = if op.trans_b { k } else { n };
    let (want, want_pre) = oracle::gemm(
        &p,
        Mat {
            data: &af,
            ld: ca,
            stride: ra * ca,
        },
        Mat {
            data: &bf,
            ld: cb,
            stride: n * k,
        },
        Some(Mat {
            data: &cf,
            ld: n,
            stride: m * n,
        }),
        with_bias.then_some(&biasf[..]),
        Some(Mat {
            data: &pre_inf,
            ld: n,
            stride: m * n,
        }),
    );
    assert_close(
        "gemm provider d",
        DType::BF16,
        seed,
        &to_f64(&y.to_host()?),
        &want,
    );
    if store {
        assert_close(
            "gemm provider pre",
            DType::BF16,
            seed,
            &to_f64(&pre.to_host()?),
            &want_pre,
        );
    }
    Ok(())
}

#[test]
fn every_runnable_provider_matches_the_oracle() {
    let _env = env_lock();
    let cases = [
        Gemm::new(67, 136, 40)
            .trans_b(true)
            .epilogue(Epilogue::BiasGelu(Gelu::Tanh)),
        Gemm::new(64, 72, 48).trans_b(true).epilogue(Epilogue::Bias),
        Gemm::new(33, 40, 24).epilogue(Epilogue::DGelu(Gelu::Tanh)),
        Gemm::new(40, 24, 56).trans_a(true).alpha(0.5).beta(1.0),
        Gemm::new(16, 32, 24).trans_a(true).trans_b(true).batch(3),
        // Not expressible in cuBLASLt: Auto is ferrotron, forced is an error.
        Gemm::new(24, 16, 8).epilogue(Epilogue::BiasGelu(Gelu::Erf)),
    ];
    let n_cases = cases.len();
    for dev in devices("gemm_provider", n_cases * 3) {
        for base in cases {
            for want in [
                GemmProvider::Auto,
                GemmProvider::Ferrotron,
                GemmProvider::CublasLt,
            ] {
                let op = base.provider(want);
                match op.selection::<bf16, bf16>(&dev) {
                    Ok(sel) => {
                        if dev.kind() == BackendKind::Emu {
                            assert_eq!(sel.provider, Provider::Ferrotron);
                        }
                        check_against_oracle(&dev, op)
                            .unwrap_or_else(|e| panic!("{op:?} on {}: {e}", dev.name()));
                    }
                    Err(e @ (Error::BackendUnavailable { .. } | Error::InvalidArgument { .. })) => {
                        // Explicit cuBLASLt where it cannot run: an error,
                        // and run() says the same.
                        assert_eq!(want, GemmProvider::CublasLt, "{e}");
                        assert!(check_against_oracle(&dev, op).is_err());
                        if dev.kind() == BackendKind::Cuda
                            && matches!(e, Error::BackendUnavailable { .. })
                        {
                            eprintln!(
                                "[ferrotron] gemm_provider: SKIPPED the cuBLASLt case on {}: {e}",
                                dev.name()
                            );
                        }
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
    }
}
