//! The GEMM oracle harness shared by `tests/gemm.rs` (mma kernel) and
//! `tests/gemm_sm90.rs` (wgmma kernel): one case against the f64 oracle
//! (`ferrotron::reference::gemm`), with output padding checked untouched.

use crate::common::{assert_close, Rng};
use ferrotron::core::dtype::FloatElement;
use ferrotron::core::plan::gemm::GemmTile;
use ferrotron::ops::gemm::{Aux, Epilogue, Gemm, GemmInputs, GemmKernel};
use ferrotron::ops::gemm_provider::GemmProvider;
use ferrotron::ops::Gelu;
use ferrotron::reference::gemm::{self as oracle, Mat, Problem};
use ferrotron::{Device, DeviceBuffer};

/// Every epilogue that has a bias or a GeLU, each GeLU form once.
pub const FUSED_EPILOGUES: [Epilogue; 5] = [
    Epilogue::Bias,
    Epilogue::BiasGelu(Gelu::Tanh),
    Epilogue::BiasGelu(Gelu::Erf),
    Epilogue::DGelu(Gelu::Tanh),
    Epilogue::DGelu(Gelu::Erf),
];

#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub ta: bool,
    pub tb: bool,
    pub epi: Epilogue,
    pub alpha: f32,
    pub beta: f32,
    /// beta != 0: C is a separate buffer (else D is accumulated in place).
    pub c_separate: bool,
    pub bias: bool,
    pub store_pre: bool,
    /// Added to every leading dimension; added to every batch stride.
    pub pad: usize,
    pub extra: usize,
    /// Leading dimensions rounded up to a multiple of this (1: none), e.g.
    /// 8 for the 16-byte rows TMA needs.
    pub ld_align: usize,
    /// Batch stride 0 for B (one B for every batch entry).
    pub broadcast_b: bool,
    pub tile: Option<GemmTile>,
    pub fast: bool,
    /// The kernel asked for; with `Some`, the one that must run.
    pub kernel: GemmKernel,
    pub expect: Option<GemmKernel>,
}

impl Case {
    pub fn new(m: usize, n: usize, k: usize) -> Case {
        Case {
            m,
            n,
            k,
            batch: 1,
            ta: false,
            tb: false,
            epi: Epilogue::None,
            alpha: 1.0,
            beta: 0.0,
            c_separate: true,
            bias: false,
            store_pre: false,
            pad: 0,
            extra: 0,
            ld_align: 1,
            broadcast_b: false,
            tile: None,
            fast: true,
            kernel: GemmKernel::Auto,
            expect: None,
        }
    }
}

/// A stored `[rows, cols]` x batch operand: (ld, stride, buffer length).
fn stored(
    rows: usize,
    cols: usize,
    batch: usize,
    pad: usize,
    extra: usize,
    align: usize,
) -> (usize, usize, usize) {
    let ld = (cols + pad).next_multiple_of(align.max(1));
    let stride = rows * ld + extra;
    (ld, stride, (batch * stride).max(1))
}

pub fn run_case<T: FloatElement, O: FloatElement>(dev: &Device, cs: Case) {
    let (mut rng, seed) = Rng::new((cs.m * 1_000_003 + cs.n * 1009 + cs.k) as u64);
    let stream = dev.new_stream().unwrap();
    let (m, n, k, batch) = (cs.m, cs.n, cs.k, cs.batch);
    let (ra, ca) = if cs.ta { (k, m) } else { (m, k) };
    let (rb, cb) = if cs.tb { (n, k) } else { (k, n) };
    let (lda, sa, la) = stored(ra, ca, batch, cs.pad, cs.extra, cs.ld_align);
    let (ldb, mut sb, mut lb) = stored(rb, cb, batch, cs.pad, cs.extra, cs.ld_align);
    if cs.broadcast_b {
        sb = 0;
        lb = (rb * ldb).max(1);
    }
    let (ldd, sd, ld_len) = stored(m, n, batch, cs.pad, cs.extra, cs.ld_align);
    let (a, af) = rng.tensor::<T>(la, 1.0);
    let (b, bf) = rng.tensor::<T>(lb, 1.0);
    let (bias, biasf) = rng.tensor::<T>(n, 1.0);
    let (c, cf) = rng.tensor::<O>(ld_len, 1.0);
    let (pre_in, pre_inf) = rng.tensor::<O>(ld_len, 2.0);
    let (ad, bd, biasd, cd, pred) = (
        dev.upload(&a).unwrap(),
        dev.upload(&b).unwrap(),
        dev.upload(&bias).unwrap(),
        dev.upload(&c).unwrap(),
        dev.upload(&pre_in).unwrap(),
    );
    let in_place = cs.beta != 0.0 && !cs.c_separate;
    let mut dd: DeviceBuffer<O> = if in_place {
        dev.upload(&c).unwrap()
    } else {
        let mut x = dev.alloc_zeros::<O>(ld_len).unwrap();
        stream.fill_bytes(&mut x, 0xFF).unwrap(); // NaN
        x
    };
    let d_before = dd.to_host().unwrap();
    let mut pre_out = dev.alloc_zeros::<O>(ld_len).unwrap();
    stream.fill_bytes(&mut pre_out, 0xFF).unwrap();

    let explicit = cs.pad != 0 || cs.extra != 0 || cs.ld_align > 1;
    let some = |v: usize| explicit.then_some(v);
    let op = Gemm::new(m, n, k)
        .provider(GemmProvider::Ferrotron)
        .trans_a(cs.ta)
        .trans_b(cs.tb)
        .batch(batch)
        .alpha(cs.alpha)
        .beta(cs.beta)
        .epilogue(cs.epi)
        .tile(cs.tile)
        .fast_path(cs.fast)
        .kernel(cs.kernel)
        .lds(
            some(lda),
            some(ldb),
            (cs.c_separate && cs.beta != 0.0)
                .then_some(ldd)
                .filter(|_| explicit),
            some(ldd),
            some(ldd),
        )
        .strides(
            some(sa),
            if cs.broadcast_b { Some(0) } else { some(sb) },
            (cs.c_separate && cs.beta != 0.0)
                .then_some(sd)
                .filter(|_| explicit),
            some(sd),
            some(sd),
        );
    if let Some(want) = cs.expect {
        let got = op.kernel_choice(dev, &ad, &bd).unwrap();
        assert_eq!(got.kernel, want, "{cs:?}: kernel choice {got:?}");
    }
    let aux = match cs.epi {
        Epilogue::DGelu(_) => Aux::PreActivation(&pred),
        Epilogue::BiasGelu(_) if cs.store_pre => Aux::Store(&mut pre_out),
        _ => Aux::None,
    };
    let inputs = GemmInputs {
        a: &ad,
        b: &bd,
        bias: cs.bias.then_some(&biasd),
        c: (cs.beta != 0.0 && cs.c_separate).then_some(&cd),
    };
    op.run(&stream, inputs, aux, &mut dd)
        .unwrap_or_else(|e| panic!("{cs:?}: {e}"));
    stream
        .synchronize()
        .unwrap_or_else(|e| panic!("{cs:?}: {e}"));

    let p = Problem {
        m,
        n,
        k,
        batch,
        trans_a: cs.ta,
        trans_b: cs.tb,
        alpha: cs.alpha as f64,
        beta: cs.beta as f64,
        epilogue: cs.epi,
    };
    let mat = |data, ld, stride| Mat { data, ld, stride };
    let (want, want_pre) = oracle::gemm(
        &p,
        mat(&af, lda, sa),
        mat(&bf, ldb, sb),
        Some(mat(&cf, ldd, sd)),
        cs.bias.then_some(&biasf[..]),
        Some(mat(&pre_inf, ldd, sd)),
    );
    let got_all = dd.to_host().unwrap();
    let gather = |v: &[O]| -> Vec<f64> {
        let mut out = Vec::with_capacity(batch * m * n);
        for bz in 0..batch {
            for r in 0..m {
                for c in 0..n {
                    out.push(v[bz * sd + r * ldd + c].to_f64());
                }
            }
        }
        out
    };
    let what = format!("{cs:?} {}->{} on {dev:?}", T::DTYPE, O::DTYPE);
    assert_close(&what, O::DTYPE, seed, &gather(&got_all), &want);
    // Everything outside the output matrices is untouched.
    for (i, (g, b0)) in got_all.iter().zip(&d_before).enumerate() {
        let (bz, r, c) = (i / sd.max(1), i % sd.max(1) / ldd, i % sd.max(1) % ldd);
        let inside = bz < batch && r < m && c < n && sd > 0;
        if !inside {
            assert!(
                bytemuck::bytes_of(g) == bytemuck::bytes_of(b0),
                "{what}: padding element {i} was written (seed {seed})"
            );
        }
    }
    if cs.store_pre && matches!(cs.epi, Epilogue::BiasGelu(_)) {
        assert_close(
            &format!("pre-activation {what}"),
            O::DTYPE,
            seed,
            &gather(&pre_out.to_host().unwrap()),
            &want_pre,
        );
    }
}
