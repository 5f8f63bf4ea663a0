//! The kernels and shapes the model evaluates, with their launch plans (the
//! crate's own `core::plan`, so the model sees the launches the ops make),
//! byte counts and the H200 measurements of docs/perf.md where there is one.

use ferrotron::core::plan;

/// Where a phase's main region is in the source: the first line containing
/// `snippet` after the first line containing `within`. The region is the
/// innermost loop holding an instruction of that line whose widest global
/// load is `widest` bytes, or the whole kernel when no loop holds it.
#[derive(Clone, Copy, Debug)]
pub struct Anchor {
    pub file: &'static str,
    pub within: &'static str,
    pub snippet: &'static str,
    pub widest: u32,
}

/// Elements one thread handles in one pass over the region's hot path.
#[derive(Clone, Copy, Debug)]
pub enum Elems {
    /// Global bytes the hot path loads per element (data plus any cached
    /// operand loaded alongside, e.g. a bias).
    PerLoadedBytes(f64),
    Fixed(f64),
}

#[derive(Clone, Debug)]
pub struct PhaseSpec {
    pub kernel: String,
    pub anchor: Anchor,
    pub elems_per_iter: Elems,
    /// Elements a thread handles per round when fewer than the hot path's
    /// (a row shorter than the kernel's register tile).
    pub elems_per_round: Option<f64>,
    pub threads: u32,
    pub blocks: u64,
    pub elems: f64,
    /// DRAM bytes per element: reads + writes.
    pub bytes_per_elem: f64,
    pub read_bytes_per_elem: f64,
    /// Bytes per element re-read from L2 (a second pass over a row).
    pub l2_read_bytes_per_elem: f64,
    pub one_round_per_block: bool,
    /// Rounds ahead the phase's global reads are issued (cp.async
    /// pipeline depth - 1; 0: none).
    pub prefetch_rounds: f64,
    /// Dynamic shared memory per block (the launch's).
    pub dynamic_smem: u32,
}

#[derive(Clone, Debug)]
pub struct Case {
    pub family: &'static str,
    pub name: String,
    pub backward: bool,
    pub phases: Vec<PhaseSpec>,
    /// The fused floor (docs: each kernel's header).
    pub floor_bytes: f64,
    /// The bytes the measurement counted (its GiB/s column).
    pub bench_bytes: f64,
    /// Measured ratio to copy on the H200 (docs/perf.md), if any.
    pub measured: Option<f64>,
    /// A target shape: the issue's >= 90 % (forward) / >= 85 % (backward)
    /// applies.
    pub target: bool,
}

const BF16: usize = 2;

fn anchor(file: &'static str, within: &'static str, snippet: &'static str, widest: u32) -> Anchor {
    Anchor {
        file,
        within,
        snippet,
        widest,
    }
}

#[allow(clippy::too_many_arguments)]
fn phase(
    kernel: impl Into<String>,
    anchor: Anchor,
    elems_per_iter: Elems,
    cfg: ferrotron::core::launch::LaunchConfig,
    elems: f64,
    bytes_per_elem: f64,
    read_bytes_per_elem: f64,
) -> PhaseSpec {
    PhaseSpec {
        kernel: kernel.into(),
        anchor,
        elems_per_iter,
        elems_per_round: None,
        threads: cfg.block[0] * cfg.block[1] * cfg.block[2],
        blocks: cfg.grid[0] as u64 * cfg.grid[1] as u64 * cfg.grid[2] as u64,
        elems,
        bytes_per_elem,
        read_bytes_per_elem,
        l2_read_bytes_per_elem: 0.0,
        one_round_per_block: false,
        prefetch_rounds: 0.0,
        dynamic_smem: cfg.dynamic_smem_bytes,
    }
}

fn bias_gelu(rows: u64, cols: u64, vector: bool, measured: [Option<f64>; 2]) -> Vec<Case> {
    let n = (rows * cols) as f64;
    let e = BF16 as f64;
    let tag = if vector { "128-bit" } else { "scalar" };
    let w = if vector { 16 } else { 2 };
    let f = plan::bias_gelu::forward(rows, cols, BF16, vector);
    let fwd = phase(
        "ftn_bias_gelu_fwd_bf16",
        anchor(
            "gelu.cuh",
            "ftn_gelu_tanh_fast(float x)",
            "const float u",
            w,
        ),
        Elems::PerLoadedBytes(2.0 * e),
        f.cfg,
        n,
        2.0 * e,
        e,
    );
    let b = plan::bias_gelu::backward(rows, cols, BF16, vector);
    let bwd = phase(
        "ftn_bias_gelu_bwd_bf16",
        anchor(
            "gelu.cuh",
            "ftn_gelu_tanh_grad_fast(float x)",
            "const float u",
            w,
        ),
        Elems::PerLoadedBytes(2.0 * e),
        b.cfg,
        n,
        3.0 * e,
        2.0 * e,
    );
    let sum = phase(
        "ftn_column_sum_partials_bf16",
        anchor(
            "reduce.cuh",
            "ftn_column_chunk_sum(",
            "? partial[(k + u * step) * cols + c]",
            4,
        ),
        Elems::PerLoadedBytes(4.0),
        b.reduce_cfg,
        (b.chunks * cols) as f64,
        4.0,
        4.0,
    );
    let shape = format!("{rows}x{cols} {tag}");
    vec![
        Case {
            family: "bias+GeLU",
            name: format!("fwd {shape}"),
            backward: false,
            phases: vec![fwd],
            floor_bytes: 2.0 * n * e,
            bench_bytes: 2.0 * n * e,
            measured: measured[0],
            target: vector,
        },
        Case {
            family: "bias+GeLU",
            name: format!("bwd {shape}"),
            backward: true,
            phases: vec![bwd, sum],
            floor_bytes: 3.0 * n * e,
            bench_bytes: 3.0 * n * e,
            measured: measured[1],
            target: vector,
        },
    ]
}

fn softmax(rows: u64, sk: u64, measured: [Option<f64>; 2], target: bool) -> Vec<Case> {
    use plan::softmax::SoftmaxPath;
    let n = (rows * sk) as f64;
    let e = BF16 as f64;
    let p = plan::softmax::plan(rows, sk, BF16, true, None).expect("softmax plan");
    let w = p.vec * BF16 as u32;
    let (fwd, bwd) = match p.path {
        SoftmaxPath::Warp => {
            // Values per lane: a row shorter than two vectors per lane is two
            // vectors on each of fewer lanes (several rows per warp).
            let l = if p.rows_per_warp > 1 {
                2 * p.vec
            } else {
                p.per_lane
            } as f64;
            (
                vec![phase(
                    format!("ftn_softmax_fwd_warp{}_bf16", p.per_lane),
                    // The copy without dropout (the kernels hold both).
                    anchor("softmax.cu", "void sm_store_probs(", "// y alone", w),
                    Elems::Fixed(l),
                    p.cfg,
                    n,
                    2.0 * e,
                    e,
                )],
                vec![phase(
                    format!("ftn_softmax_bwd_warp{}_bf16", p.per_lane),
                    anchor("softmax.cu", "void sm_bwd_rows(", "for (int64_t rw =", w),
                    Elems::Fixed(l),
                    p.cfg,
                    n,
                    3.0 * e,
                    2.0 * e,
                )],
            )
        }
        SoftmaxPath::Block => {
            let per = (sk as f64 / p.cfg.block[0] as f64).ceil();
            let mk = |k: &str, a: Anchor, bytes: f64, reads: f64| {
                let mut ph = phase(
                    k,
                    a,
                    Elems::Fixed(plan::softmax::BLOCK_ITEMS as f64),
                    p.cfg,
                    n,
                    bytes,
                    reads,
                );
                ph.elems_per_round = Some(per);
                ph.one_round_per_block = rows <= p.cfg.grid[0] as u64;
                ph
            };
            (
                vec![mk(
                    "ftn_softmax_fwd_block_vec_bf16",
                    anchor("softmax.cu", "void sm_store_probs(", "// y alone", w),
                    2.0 * e,
                    e,
                )],
                vec![mk(
                    "ftn_softmax_bwd_block_bf16",
                    anchor("softmax.cu", "void sm_bwd_rows(", "dot += yv[k] * gv[k]", w),
                    3.0 * e,
                    2.0 * e,
                )],
            )
        }
        SoftmaxPath::Long => {
            let v = p.vec as f64;
            let mk = |k: &str, a: Anchor, per: f64, bytes: f64, reads: f64, l2: f64| {
                let mut ph = phase(k, a, Elems::Fixed(per), p.cfg, n, bytes, reads);
                ph.l2_read_bytes_per_elem = l2;
                ph
            };
            // The forward takes LONG_UNROLL vectors per step.
            let u = v * plan::softmax::LONG_UNROLL as f64;
            let fk = "ftn_softmax_fwd_long_bf16";
            let bk = "ftn_softmax_bwd_long_bf16";
            let fw = "void sm_fwd_long_impl(";
            let bw = "void sm_bwd_long_impl(";
            (
                vec![
                    mk(
                        fk,
                        anchor("softmax.cu", fw, "ts += sm_exp(v[u][k]", w),
                        u,
                        e,
                        e,
                        0.0,
                    ),
                    // The second read of the row is an L2 hit: only y goes to DRAM.
                    mk(
                        fk,
                        anchor("softmax.cu", fw, "v[u][k] = sm_exp(v[u][k] - mx)", w),
                        u,
                        e,
                        0.0,
                        e,
                    ),
                ],
                vec![
                    mk(
                        bk,
                        anchor("softmax.cu", bw, "dot += yv[k]", w),
                        v,
                        2.0 * e,
                        2.0 * e,
                        0.0,
                    ),
                    mk(
                        bk,
                        anchor("softmax.cu", bw, "gv[k] = p.scale", w),
                        v,
                        e,
                        0.0,
                        2.0 * e,
                    ),
                ],
            )
        }
    };
    let path = format!("{:?}", p.path).to_lowercase();
    vec![
        Case {
            family: "softmax",
            name: format!("fwd {rows}x{sk} ({path})"),
            backward: false,
            phases: fwd,
            floor_bytes: 2.0 * n * e,
            bench_bytes: 2.0 * n * e,
            measured: measured[0],
            target,
        },
        Case {
            family: "softmax",
            name: format!("bwd {rows}x{sk} ({path})"),
            backward: true,
            phases: bwd,
            floor_bytes: 3.0 * n * e,
            bench_bytes: 3.0 * n * e,
            measured: measured[1],
            target,
        },
    ]
}

/// LayerNorm with gamma and beta: forward, backward (input and parameter
/// gradients), backward input gradient only.
/// The block forward of bf16 128-bit rows: a run of rows per block, gamma
/// and beta staged in shared memory, FWD_HELD_ITEMS values per thread.
fn layernorm_block_forward(
    pf: &plan::layernorm::RowPlan,
    hidden: u64,
    n: f64,
    bytes: f64,
    reads: f64,
) -> PhaseSpec {
    let a = anchor(
        "layernorm.cu",
        "void fwd_row_cached(",
        "const float u = fmaf(v[k] - pivot, rstd, neg_shift_rstd)",
        pf.vec * BF16 as u32,
    );
    let items = plan::layernorm::FWD_HELD_ITEMS as f64;
    let mut ph = phase(
        "ftn_layernorm_fwd_block_bf16",
        a,
        Elems::Fixed(items),
        pf.cfg,
        n,
        bytes,
        reads,
    );
    ph.elems_per_round = Some((hidden as f64 / pf.cfg.block[0] as f64).ceil());
    ph
}

fn layernorm(rows: u64, hidden: u64, measured: [Option<f64>; 3]) -> Vec<Case> {
    use plan::layernorm::RowPath;
    let n = (rows * hidden) as f64;
    let e = BF16 as f64;
    let stats = 8.0 / hidden as f64;
    let p = plan::layernorm::rows(rows, hidden, BF16, true);
    let pf = plan::layernorm::forward(rows, hidden, BF16, true);
    let w = p.vec * BF16 as u32;
    let bw_cached = "void bwd_row_cached(";
    // The staged block forward, wherever the forward's plan takes it.
    let block_fwd = (pf.path == RowPath::Block)
        .then(|| layernorm_block_forward(&pf, hidden, n, 2.0 * e + stats, e));
    let (fwd, bwd) = match p.path {
        RowPath::Warp | RowPath::Block => {
            let (kind, items, per) = if p.path == RowPath::Warp {
                ("warp", plan::layernorm::WARP_ITEMS, hidden as f64 / 32.0)
            } else {
                (
                    "block",
                    plan::layernorm::BLOCK_ITEMS,
                    (hidden as f64 / p.cfg.block[0] as f64).ceil(),
                )
            };
            // The block backward (dx) takes one row per block.
            let mk = |k: String, a: Anchor, bytes: f64, reads: f64| {
                let mut ph = phase(k, a, Elems::Fixed(items as f64), p.cfg, n, bytes, reads);
                ph.elems_per_round = Some(per);
                ph.one_round_per_block = p.path == RowPath::Block;
                ph
            };
            let warp = p.path == RowPath::Warp;
            let ba = if warp {
                anchor("layernorm.cu", "void bwd_warp(", "for (int64_t row =", w)
            } else {
                anchor(
                    "layernorm.cu",
                    bw_cached,
                    "o[k] = fmaf(dv[k] * g[k], rstd",
                    w,
                )
            };
            let fwd = match block_fwd {
                Some(f) => f,
                None => {
                    let a = anchor("layernorm.cu", "void fwd_warp(", "for (int64_t row =", w);
                    mk("ftn_layernorm_fwd_warp_bf16".into(), a, 2.0 * e + stats, e)
                }
            };
            (
                vec![fwd],
                vec![mk(
                    format!("ftn_layernorm_bwd_{kind}_bf16"),
                    ba,
                    3.0 * e + stats,
                    2.0 * e,
                )],
            )
        }
        RowPath::Global => {
            let v = p.vec as f64;
            let mk = |k: &str, a: Anchor, bytes: f64, reads: f64, l2: f64| {
                let mut ph = phase(k, a, Elems::Fixed(v), p.cfg, n, bytes, reads);
                ph.l2_read_bytes_per_elem = l2;
                ph
            };
            let (fk, bk) = (
                "ftn_layernorm_fwd_global_bf16",
                "ftn_layernorm_bwd_global_bf16",
            );
            let (fw, bw) = ("void fwd_global(", "void bwd_global(");
            // 16-bit rows up to FWD_STAGED_MAX_HIDDEN: the block forward.
            let fwd = if let Some(f) = block_fwd {
                vec![f]
            } else {
                vec![
                    {
                        // The statistics pass: kGlobalUnroll (4) vectors
                        // per iteration.
                        let mut ph = mk(
                            fk,
                            anchor("layernorm.cu", fw, "s += v[k] - pivot", w),
                            e,
                            e,
                            0.0,
                        );
                        ph.elems_per_iter = Elems::Fixed(4.0 * v);
                        ph
                    },
                    mk(
                        fk,
                        anchor("layernorm.cu", fw, "o[k] = fmaf(fmaf(v[k] - pivot", w),
                        e,
                        0.0,
                        e,
                    ),
                ]
            };
            (
                fwd,
                vec![
                    mk(
                        bk,
                        anchor("layernorm.cu", bw, "s1 += gh", w),
                        2.0 * e,
                        2.0 * e,
                        0.0,
                    ),
                    mk(
                        bk,
                        anchor("layernorm.cu", bw, "o[k] = rstd * (d[k]", w),
                        e,
                        0.0,
                        2.0 * e,
                    ),
                ],
            )
        }
    };
    // Stage two: the chunks' fp32 partials (gamma and beta) summed per column.
    let column_sum = |chunks: u64, cfg| {
        phase(
            "ftn_layernorm_column_sum_bf16",
            anchor(
                "reduce.cuh",
                "ftn_column_chunk_sum(",
                "? partial[(k + u * step) * cols + c]",
                4,
            ),
            Elems::PerLoadedBytes(4.0),
            cfg,
            (2 * chunks * hidden) as f64,
            4.0,
            4.0,
        )
    };
    let g = plan::layernorm::param_grads(rows, hidden, BF16, true, true);
    let pg = phase(
        "ftn_layernorm_param_grad_bf16",
        anchor(
            "layernorm.cu",
            "void param_grad_columns(",
            "for (int64_t r = r0",
            g.vec * 2,
        ),
        // x, dy (2 + 2 bytes) and the row's mean and rstd (8 bytes per row
        // of `vec` columns) per element.
        Elems::PerLoadedBytes(4.0 + 8.0 / g.vec as f64),
        g.cfg,
        n,
        2.0 * e,
        2.0 * e,
    );
    let fused_plan = plan::layernorm::fused_backward(rows, hidden, BF16, true, true);
    let fused = fused_plan.is_some();
    let full = match fused_plan {
        Some(f) => {
            // dx and the chunk partials in one pass: reads x, dy and the
            // statistics, writes dx and 8 bytes per column and chunk.
            let (kind, per) = if f.path == RowPath::Warp {
                ("warp", hidden as f64 / 32.0)
            } else {
                ("block", (hidden as f64 / f.cfg.block[0] as f64).ceil())
            };
            let items = match f.path {
                RowPath::Warp => plan::layernorm::WARP_ITEMS,
                RowPath::Block => plan::layernorm::BLOCK_ITEMS,
                RowPath::Global => plan::layernorm::FUSED_PIPE_WIDE_ITEMS,
            };
            // A cluster's block holds a slice of the row.
            let per = if f.cluster > 1 {
                (plan::layernorm::cluster_slice(hidden, f.cluster) as f64 / f.cfg.block[0] as f64)
                    .ceil()
            } else {
                per
            };
            let partials = 8.0 * f.chunks as f64 / rows as f64;
            // The pipelined kernel: x and dy reach shared memory by
            // cp.async, FUSED_PIPE_STAGES - 1 rows ahead.
            let cluster_kind = format!("cluster{}", f.cluster);
            let (kind, within) = if f.cluster > 1 {
                (cluster_kind.as_str(), "void bwd_fused_pipe(")
            } else if f.pipelined && f.path == RowPath::Global {
                ("pipe_wide", "void bwd_fused_pipe(")
            } else if f.pipelined {
                ("pipe", "void bwd_fused_pipe(")
            } else {
                (kind, bw_cached)
            };
            let mut ph = phase(
                format!("ftn_layernorm_bwd_fused_{kind}_bf16"),
                anchor("layernorm.cu", within, "o[k] = fmaf(dv[k] * g[k], rstd", w),
                Elems::Fixed(items as f64),
                f.cfg,
                n,
                3.0 * e + stats + partials,
                2.0 * e + stats,
            );
            ph.elems_per_round = Some(per);
            if f.pipelined {
                ph.prefetch_rounds = (plan::layernorm::FUSED_PIPE_STAGES - 1) as f64;
            }
            vec![ph, column_sum(f.chunks, f.reduce_cfg)]
        }
        None => {
            let mut v = bwd.clone();
            v.push(pg);
            v.push(column_sum(g.chunks, g.reduce_cfg));
            v
        }
    };
    let shape = format!("{rows}x{hidden} ({:?})", p.path).to_lowercase();
    let fwd_shape = format!("{rows}x{hidden} ({:?})", pf.path).to_lowercase();
    let target = hidden >= 4096;
    vec![
        Case {
            family: "LayerNorm",
            name: format!("fwd {fwd_shape}"),
            backward: false,
            phases: fwd,
            floor_bytes: 2.0 * n * e + 8.0 * rows as f64,
            bench_bytes: 2.0 * n * e + 8.0 * rows as f64,
            measured: measured[0],
            target,
        },
        Case {
            family: "LayerNorm",
            name: format!("bwd {shape}"),
            backward: true,
            phases: full,
            floor_bytes: 3.0 * n * e,
            // What the GPU check counts: 3n where the plan fuses, else
            // the unfused passes' 5n.
            bench_bytes: if fused { 3.0 } else { 5.0 } * n * e,
            measured: measured[1],
            target,
        },
        Case {
            family: "LayerNorm",
            name: format!("bwd dx {shape}"),
            backward: true,
            phases: bwd,
            floor_bytes: 3.0 * n * e,
            bench_bytes: 3.0 * n * e,
            measured: measured[2],
            target: false,
        },
    ]
}

/// The multi-tensor kernels over an fp32 list of `bytes` (the bench's list
/// mixes fp32/bf16/fp16; the model takes the fp32 loop).
fn multi_tensor(bytes: f64, measured: [Option<f64>; 3]) -> Vec<Case> {
    let tensors = 100u64;
    let numel = (bytes / 4.0 / tensors as f64) as u64;
    let p = plan::multi_tensor::plan("perf-model", &vec![numel; tensors as usize]).expect("plan");
    let cfg = p.cfg.expect("non-empty list");
    let n = (numel * tensors) as f64;
    let a = anchor("multi_tensor.cu", "void mt_visit(", "for (int64_t base", 16);
    let mk = |k: &str, bytes: f64, reads: f64| phase(k, a, Elems::Fixed(4.0), cfg, n, bytes, reads);
    [
        (
            "unscale",
            "ftn_multi_tensor_unscale",
            8.0,
            measured[0],
            false,
        ),
        (
            "l2norm",
            "ftn_multi_tensor_l2norm_partial",
            4.0,
            measured[1],
            false,
        ),
        ("clip", "ftn_multi_tensor_clip", 8.0, measured[2], false),
    ]
    .into_iter()
    .map(|(name, k, b, m, bwd)| Case {
        family: "multi-tensor",
        name: format!("{name} {tensors} x {numel} fp32"),
        backward: bwd,
        phases: vec![mk(k, b, 4.0)],
        floor_bytes: n * b,
        bench_bytes: n * b,
        measured: m,
        target: true,
    })
    .collect()
}

fn adam(params: u64) -> Case {
    let p = plan::multi_tensor::plan("perf-model", &[params]).expect("plan");
    let cfg = p.cfg.expect("non-empty");
    let n = params as f64;
    // fp32 p, m, v read + written, bf16 gradient read, bf16 model copy written.
    let bytes = 24.0 + 2.0 + 2.0;
    Case {
        family: "AdamW",
        name: format!("step {params} params, bf16 grads + bf16 copy"),
        backward: true,
        phases: vec![phase(
            "ftn_adam",
            // The vector loop: 4 elements per thread, 128-bit p, m, v.
            anchor("adam.cu", "void adam_elem(", "float u = (m * k.rbc1)", 16),
            Elems::Fixed(4.0),
            cfg,
            n,
            bytes,
            14.0,
        )],
        floor_bytes: n * bytes,
        bench_bytes: n * bytes,
        measured: None,
        target: true,
    }
}

fn cross_entropy(tokens: u64, vocab: u64) -> Vec<Case> {
    let n = (tokens * vocab) as f64;
    let e = BF16 as f64;
    // The backward: one block per token row; the statistics: the kernel and
    // grid the plan picks (a warp per row up to 1024 columns). 128-bit loads
    // (the row is aligned: vocab shards are multiples of 128 columns).
    let rows = plan::vocab_parallel::per_row(tokens as usize);
    let stats_plan = plan::vocab_parallel::ce_stats(tokens as usize, vocab as usize);
    // One pass (online softmax): the logits are read once.
    let stats = phase(
        format!("{}_bf16", stats_plan.kernel.name_stem()),
        anchor(
            "vocab_parallel.cu",
            "void vp_fold(",
            "st.s += __expf(x[u][k] - mx)",
            16,
        ),
        Elems::PerLoadedBytes(e),
        stats_plan.cfg,
        n,
        e,
        e,
    );
    let bwd = phase(
        "ftn_vocab_ce_bwd_bf16",
        anchor(
            "vocab_parallel.cu",
            "void vp_ce_grad(",
            "fmaf(__expf(v[u][k] - m)",
            16,
        ),
        Elems::PerLoadedBytes(e),
        rows,
        n,
        2.0 * e,
        e,
    );
    vec![
        Case {
            family: "vocab CE",
            name: format!("fwd {tokens}x{vocab}"),
            backward: false,
            phases: vec![stats],
            floor_bytes: n * e,
            bench_bytes: n * e,
            measured: None,
            target: true,
        },
        Case {
            family: "vocab CE",
            name: format!("bwd {tokens}x{vocab}"),
            backward: true,
            phases: vec![bwd],
            floor_bytes: 2.0 * n * e,
            bench_bytes: 2.0 * n * e,
            measured: None,
            target: true,
        },
    ]
}

/// The embedding backward (overwrite, the dense fp32 gradient shard): the
/// sort of the token keys (O(T log^2 T) over 8 bytes per token, L2-resident:
/// not modelled), then one block per shard row: the segment loop reads each
/// of this shard's dy rows once (bf16) and every row of dweight is written
/// once (fp32). Floor: rows * hidden * 4 + tokens * hidden * 2 bytes (ids
/// and keys aside).
fn embedding_backward(rows: u64, hidden: u64, tokens: u64) -> Case {
    let e = BF16 as f64;
    let cfg = plan::vocab_parallel::per_row(rows as usize);
    let dw = (rows * hidden) as f64;
    let dy = (tokens * hidden) as f64;
    let file = "vocab_parallel.cu";
    let within = "void vp_embed_bwd_cols(";
    // The token loop: one 128-bit dy load per 8 columns and token.
    let sum = phase(
        "ftn_vocab_embed_bwd_bf16",
        anchor(file, within, "acc[u][k] += d[u][k]", 16),
        Elems::PerLoadedBytes(e),
        cfg,
        dy,
        e,
        e,
    );
    // The column loop around it: two 128-bit fp32 stores per 8 columns, two
    // groups of 8 columns per thread (hidden 4096: one step per row).
    let store = phase(
        "ftn_vocab_embed_bwd_bf16",
        anchor(file, within, "ftn_store<float, F>(dw + h + u * S + f", 16),
        Elems::Fixed(16.0),
        cfg,
        dw,
        4.0,
        0.0,
    );
    Case {
        family: "embedding",
        name: format!("bwd {rows}x{hidden}, {tokens} tokens"),
        backward: true,
        phases: vec![sum, store],
        floor_bytes: dw * 4.0 + dy * e,
        bench_bytes: dw * 4.0 + dy * e,
        measured: None,
        target: true,
    }
}

fn copy(bytes: u64) -> Case {
    let (_, cfg) = plan::copy::plan(1, bytes, true);
    Case {
        family: "copy",
        name: format!("{} MiB, 128-bit", bytes >> 20),
        backward: false,
        phases: vec![phase(
            "ftn_copy_2d_bytes",
            anchor("copy.cu", "copy_2d", "for (int64_t i", 16),
            Elems::PerLoadedBytes(16.0),
            cfg,
            (bytes / 16) as f64,
            32.0,
            16.0,
        )],
        floor_bytes: 2.0 * bytes as f64,
        bench_bytes: 2.0 * bytes as f64,
        measured: None,
        target: true,
    }
}

/// Every case, in table order. `measured` ratios are from the GPU check's
/// `bandwidth` step on an H200, 2026-12-04 (docs/perf.md, "Second GPU
/// run"), for the same kernels at the same hidden size or sk (the check's
/// row counts fill 2^28 elements, the same shape class as here). Softmax
/// forward was measured with a padding mask (a mask byte per element, read
/// from L2 for every head), which the model's case does not have.
pub fn all() -> Vec<Case> {
    let mut v = vec![copy(256 << 20)];
    // Measured at 16384 x 32768.
    v.extend(bias_gelu(16384, 16384, true, [Some(0.715), Some(0.932)]));
    v.extend(bias_gelu(16384, 16384, false, [Some(0.182), Some(0.476)]));
    v.extend(bias_gelu(8192, 49152, true, [None, None]));
    // sk 128 was not in the check (its warp path was measured at sk 1024).
    v.extend(softmax(1048576, 128, [None, None], true));
    v.extend(softmax(32768, 4096, [Some(0.588), Some(0.756)], true));
    v.extend(softmax(2048, 65536, [Some(0.594), Some(0.582)], false));
    v.extend(softmax(4096, 16384, [Some(0.676), Some(0.864)], true));
    // Measured (fwd, fused bwd, dx-only) at hidden 1024 to 16384. At 16384 a
    // 405B-class hidden size: the global path, fused by the wide pipelined
    // backward; the forward on the block path since the global forward
    // measured 0.400 (not yet measured there).
    let measured_layernorm = [
        (131072, 1024, [Some(0.951), Some(0.642), Some(1.019)]),
        (32768, 4096, [Some(0.889), Some(0.887), Some(1.024)]),
        (16384, 8192, [Some(0.901), Some(0.758), Some(1.028)]),
        (10922, 12288, [Some(0.807), Some(0.762), Some(1.027)]),
        (16384, 16384, [None, Some(0.693), Some(0.873)]),
    ];
    for (rows, hidden, measured) in measured_layernorm {
        v.extend(layernorm(rows, hidden, measured));
    }
    // Not in the check (its kernels changed since the 2026-12-01 run).
    v.extend(layernorm(2048, 65536, [None, None, None]));
    // Measured over 1.32 G fp32 parameters (292 tensors).
    v.extend(multi_tensor(778e6, [Some(0.940), Some(1.066), Some(0.938)]));
    v.push(adam(1 << 28));
    v.extend(cross_entropy(8192, 50304));
    v.extend(cross_entropy(8192, 131072));
    v.push(embedding_backward(50304, 4096, 8192));
    v
}
