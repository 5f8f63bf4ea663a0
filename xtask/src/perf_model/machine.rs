//! The machine and the throughput model (docs/perf.md, "Static performance
//! model"). Everything here is arithmetic on stated constants; nothing is
//! fitted per kernel.

/// An sm_90 GPU as the model sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Machine {
    pub sms: u32,
    pub regs_per_sm: u32,
    /// Registers are allocated per warp in units of this many.
    pub reg_alloc_unit: u32,
    pub smem_per_sm: u32,
    /// Shared memory the hardware reserves per resident block.
    pub smem_reserved_per_block: u32,
    pub max_threads_per_sm: u32,
    pub max_blocks_per_sm: u32,
    /// Warp schedulers per SM, each issuing one warp instruction per cycle.
    pub schedulers: u32,
    /// MUFU (special function) results per cycle per SM.
    pub mufu_per_cycle: u32,
    pub clock_hz: f64,
    /// Device-to-device copy bandwidth, bytes read + written per second.
    pub copy_bytes_per_s: f64,
    /// Latency of a DRAM round trip under load, cycles (the one fitted
    /// constant; see `fit_dram_latency`).
    pub dram_latency: f64,
    /// An L2 hit (a re-read of data the kernel touched before), cycles.
    pub l2_latency: f64,
    /// One dependent warp shuffle, cycles.
    pub shfl_latency: f64,
    /// One block barrier, cycles.
    pub bar_latency: f64,
    /// One barrier.cluster (arrive.release + wait.acquire) in a loop,
    /// cycles: assumed, not measured. Its SASS is MEMBAR.ALL.GPU (the
    /// release: the thread's earlier stores acknowledged GPU-wide, about an
    /// L2 round trip), UCGABAR_ARV/WAIT (a round trip between the SMs of the
    /// cluster) and CCTL.IVALL (the acquire empties L1: the next pass's
    /// cached loads, e.g. gamma, become L2 hits, one more L2 latency).
    pub cluster_bar_latency: f64,
    /// One wait on an mbarrier that another block of the cluster completes
    /// by st.async, cycles: assumed, not measured (the store's hop between
    /// SMs plus the skew between the blocks that send).
    pub mbar_wait_latency: f64,
}

/// NVIDIA H200 SXM (sm_90): 132 SMs at up to 1980 MHz; the copy bandwidth is
/// the device-to-device copy measured on one (docs/perf.md: 3692 GiB/s).
pub const H200: Machine = Machine {
    sms: 132,
    regs_per_sm: 65536,
    reg_alloc_unit: 256,
    smem_per_sm: 228 * 1024,
    smem_reserved_per_block: 1024,
    max_threads_per_sm: 2048,
    max_blocks_per_sm: 32,
    schedulers: 4,
    mufu_per_cycle: 16,
    clock_hz: 1.98e9,
    copy_bytes_per_s: 3692.0 * 1073741824.0,
    dram_latency: 1760.0,
    l2_latency: 300.0,
    shfl_latency: 30.0,
    bar_latency: 40.0,
    cluster_bar_latency: 1000.0,
    mbar_wait_latency: 500.0,
};

impl Machine {
    /// Copy bandwidth per SM, bytes per cycle.
    pub fn copy_bytes_per_cycle_sm(&self) -> f64 {
        self.copy_bytes_per_s / self.clock_hz / self.sms as f64
    }

    /// Bytes an SM must have in flight to sustain the copy bandwidth at
    /// `dram_latency` (Little's law), counting reads and writes.
    pub fn needed_in_flight(&self) -> f64 {
        self.copy_bytes_per_cycle_sm() * self.dram_latency
    }

    /// Resident blocks per SM of a kernel (the occupancy calculation).
    pub fn blocks_per_sm(&self, threads: u32, registers: u32, smem: u32) -> u32 {
        let warps = threads.div_ceil(32).max(1);
        let per_warp = (registers.max(1) * 32).div_ceil(self.reg_alloc_unit) * self.reg_alloc_unit;
        let by_regs = (self.regs_per_sm / per_warp) / warps;
        let by_threads = self.max_threads_per_sm / (warps * 32);
        let by_smem = self.smem_per_sm / (smem + self.smem_reserved_per_block);
        by_regs
            .min(by_threads)
            .min(by_smem)
            .min(self.max_blocks_per_sm)
    }
}

/// One kernel phase as the model sees it: a launch and its main region.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Phase {
    pub threads: u32,
    pub blocks: u64,
    pub registers: u32,
    pub smem: u32,
    /// Elements one thread handles per round (one iteration of the main
    /// loop, or the whole kernel when it has none).
    pub elems_per_round: f64,
    /// DRAM bytes per element, reads + writes.
    pub bytes_per_elem: f64,
    /// DRAM bytes read per element.
    pub read_bytes_per_elem: f64,
    /// Bytes per element re-read from L2 (data the kernel read before).
    pub l2_read_bytes_per_elem: f64,
    pub elems: f64,
    /// Per round and thread, from the SASS hot path.
    pub instrs_per_round: f64,
    pub mufu_per_round: f64,
    pub shfl: f64,
    pub bar: f64,
    pub cluster_bar: f64,
    pub mbar_wait: f64,
    pub load_groups: f64,
    /// Data-path loads issued only after an earlier one's result was used
    /// (each one more DRAM latency in the chain).
    pub data_waits: f64,
    /// One round per block (no loop over rows): rounds are waves of blocks,
    /// the last one possibly partial.
    pub one_round_per_block: bool,
    /// Rounds ahead that a round's global reads are issued (a cp.async
    /// pipeline: 2 when row r + 2 is copied while row r is computed); 0 when
    /// a round issues its own.
    pub prefetch_rounds: f64,
}

/// What the model says about one phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PhaseEstimate {
    pub blocks_per_sm: f64,
    pub warps_per_sm: f64,
    /// Bytes loaded per SM and round (bytes in flight when every resident
    /// thread has issued its round's loads).
    pub in_flight: f64,
    /// The latency chain of a round (DRAM/L2 latency, shuffles, barriers).
    pub memory_cycles: f64,
    pub issue_cycles: f64,
    /// Cycles the round's DRAM reads take at the SM's share of the copy rate.
    pub transfer_cycles: f64,
    pub round_cycles: f64,
    pub seconds: f64,
    /// DRAM bytes per second over the copy's (0 for a pass that only
    /// re-reads L2).
    pub fraction: f64,
}

/// The round model. Every resident thread handles `elems_per_round`
/// elements per round: it issues its loads, waits for them, computes, stores
/// (fire and forget) and starts the next round. A warp's round is therefore
/// its latency chain — one DRAM latency (an L2 latency when the round only
/// re-reads L2), an L2 latency per further dependent load group, its
/// shuffles and barriers — plus the arrival of its own reads (its block's,
/// when a barrier ties the block's warps together) at the SM's share of the
/// copy bandwidth, plus its compute, which shares the SM's schedulers with
/// every resident warp: the issue time of all resident warps' instructions
/// (or the MUFU pipe's, if slower). A round also lasts at
/// least as long as its DRAM reads take at the SM's share of the copy
/// bandwidth (Little's law: the bytes in flight over the latency). The
/// phase takes its rounds, or its DRAM bytes at the copy bandwidth,
/// whichever is longer.
///
/// A prefetching phase (`prefetch_rounds` = D > 0) issues a round's reads D
/// rounds before it needs them, so the load chain (latencies and the
/// unit's arrival) overlaps the compute of the D rounds in between: a
/// round lasts as long as its compute with its shuffles and barriers, or
/// the load chain over D, whichever is longer (and at least its transfer).
pub fn estimate(m: &Machine, p: &Phase) -> PhaseEstimate {
    let occ = m.blocks_per_sm(p.threads, p.registers, p.smem) as f64;
    let spread = p.blocks as f64 / m.sms as f64;
    let blocks = occ.min(spread).max(if p.blocks > 0 { 1.0 } else { 0.0 });
    let warps = blocks * p.threads.div_ceil(32) as f64;
    let threads = blocks * p.threads as f64;
    let round_elems = threads * p.elems_per_round;
    let peak = m.copy_bytes_per_cycle_sm();
    let issue = (warps * p.instrs_per_round / m.schedulers as f64)
        .max(threads * p.mufu_per_round / m.mufu_per_cycle as f64);
    let first = if p.read_bytes_per_elem == 0.0 && p.l2_read_bytes_per_elem > 0.0 {
        m.l2_latency
    } else {
        m.dram_latency
    };
    let loads = first * (1.0 + p.data_waits) + (p.load_groups - 1.0).max(0.0) * m.l2_latency;
    let sync = p.shfl * m.shfl_latency
        + p.bar * m.bar_latency
        + p.cluster_bar * m.cluster_bar_latency
        + p.mbar_wait * m.mbar_wait_latency;
    let memory = loads + sync;
    let transfer = round_elems * p.read_bytes_per_elem / peak;
    // The warps that wait for each other: a block when the round has a
    // barrier, else one warp. Their own reads arrive one after another,
    // within their round, before the compute that needs them.
    let unit = if p.bar > 0.0 { p.threads as f64 } else { 32.0 };
    let unit_transfer = unit * p.elems_per_round * p.read_bytes_per_elem / peak;
    let round = if p.prefetch_rounds > 0.0 {
        ((loads + unit_transfer) / p.prefetch_rounds).max(sync + issue)
    } else {
        memory + unit_transfer + issue
    }
    .max(transfer);
    let rounds = if p.one_round_per_block && occ > 0.0 {
        (p.blocks as f64 / (occ * m.sms as f64)).ceil()
    } else if round_elems > 0.0 {
        p.elems / (m.sms as f64 * round_elems)
    } else {
        0.0
    };
    let dram = p.elems * p.bytes_per_elem;
    let seconds = (rounds * round / m.clock_hz).max(dram / m.copy_bytes_per_s);
    PhaseEstimate {
        blocks_per_sm: blocks,
        warps_per_sm: warps,
        in_flight: round_elems * (p.read_bytes_per_elem + p.l2_read_bytes_per_elem),
        memory_cycles: memory,
        issue_cycles: issue,
        transfer_cycles: transfer,
        round_cycles: round,
        seconds,
        fraction: if seconds > 0.0 {
            dram / seconds / m.copy_bytes_per_s
        } else {
            0.0
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occupancy_limits() {
        let m = H200;
        // 256 threads at 32 registers: the thread limit, 8 blocks.
        assert_eq!(m.blocks_per_sm(256, 32, 0), 8);
        // 44 registers round to 48 per thread: 1536 per warp, 42 warps, 5 blocks.
        assert_eq!(m.blocks_per_sm(256, 44, 0), 5);
        // 512 threads at 128 registers: 16 warps by registers, one block.
        assert_eq!(m.blocks_per_sm(512, 128, 256), 1);
        // 32-thread blocks: the 32-block limit.
        assert_eq!(m.blocks_per_sm(32, 16, 0), 32);
        // Shared memory: 100 KB per block leaves room for two.
        assert_eq!(m.blocks_per_sm(128, 32, 100 * 1024), 2);
    }

    #[test]
    fn per_sm_copy_rate_and_littles_law() {
        let m = H200;
        let b = m.copy_bytes_per_cycle_sm();
        assert!((b - 15.17).abs() < 0.01, "{b}");
        assert!((m.needed_in_flight() - b * m.dram_latency).abs() < 1e-9);
    }

    fn phase() -> Phase {
        Phase {
            threads: 256,
            blocks: 132 * 8,
            registers: 32,
            smem: 0,
            elems_per_round: 4.0,
            bytes_per_elem: 8.0,
            read_bytes_per_elem: 4.0,
            l2_read_bytes_per_elem: 0.0,
            elems: 1e9,
            instrs_per_round: 40.0,
            mufu_per_round: 0.0,
            shfl: 0.0,
            bar: 0.0,
            cluster_bar: 0.0,
            mbar_wait: 0.0,
            load_groups: 1.0,
            data_waits: 0.0,
            one_round_per_block: false,
            prefetch_rounds: 0.0,
        }
    }

    #[test]
    fn round_model_by_hand() {
        let mut m = H200;
        m.dram_latency = 1000.0;
        m.dram_latency = 3000.0;
        let e = estimate(&m, &phase());
        // 8 blocks x 256 threads x 4 elements: 8192 elements, 32768 bytes
        // read a round; issue 64 warps x 40 / 4 = 640 cycles; the reads take
        // 32768 / 15.17 = 2160 cycles to arrive, less than 3000 + 640.
        let peak = m.copy_bytes_per_cycle_sm();
        assert_eq!(e.blocks_per_sm, 8.0);
        assert_eq!(e.issue_cycles, 640.0);
        assert_eq!(e.in_flight, 32768.0);
        assert!((e.transfer_cycles - 32768.0 / peak).abs() < 1e-9);
        // No barrier: a warp's own 32 x 4 x 4 bytes arrive in 512 / 15.17 cycles.
        let round = 3640.0 + 512.0 / peak;
        assert!((e.round_cycles - round).abs() < 1e-9);
        // 1e9 elements / (132 x 8192) rounds, against 8e9 bytes at the copy rate.
        let t = (1e9 / (132.0 * 8192.0) * round / m.clock_hz).max(8e9 / m.copy_bytes_per_s);
        assert!((e.seconds - t).abs() < 1e-15);
        assert!((e.fraction - 8e9 / t / m.copy_bytes_per_s).abs() < 1e-12);
        // Fewer elements per round, same instructions per element: no faster.
        let mut p = phase();
        p.elems_per_round = 2.0;
        p.instrs_per_round = 20.0;
        assert!(estimate(&m, &p).fraction <= e.fraction);
        // A short latency: the transfer bounds the round.
        m.dram_latency = 500.0;
        let e = estimate(&m, &phase());
        assert_eq!(e.round_cycles, e.transfer_cycles);
    }

    #[test]
    fn latency_terms_add_up() {
        let mut p = phase();
        p.shfl = 10.0;
        p.bar = 2.0;
        p.cluster_bar = 1.0;
        p.mbar_wait = 2.0;
        p.load_groups = 3.0;
        let m = H200;
        let e = estimate(&m, &p);
        let want = m.dram_latency + 2.0 * 300.0 + 10.0 * 30.0 + 2.0 * 40.0 + 1000.0 + 2.0 * 500.0;
        assert!((e.memory_cycles - want).abs() < 1e-9);
        // A barrier: the whole block's reads arrive before its compute.
        let unit = 256.0 * 4.0 * 4.0 / m.copy_bytes_per_cycle_sm();
        let round = (want + unit + e.issue_cycles).max(e.transfer_cycles);
        assert!((e.round_cycles - round).abs() < 1e-9);
    }

    #[test]
    fn the_copy_rate_caps_and_waves_round_up() {
        // Plenty in flight, few instructions: the DRAM bytes set the time.
        let mut p = phase();
        p.instrs_per_round = 1.0;
        p.elems_per_round = 64.0;
        let e = estimate(&H200, &p);
        assert!((e.fraction - 1.0).abs() < 1e-12);
        // One round per block, latency-bound: 1.5 waves take as long as 2.
        let mut q = phase();
        q.instrs_per_round = 4000.0;
        q.one_round_per_block = true;
        q.blocks = 132 * 8 * 3 / 2;
        q.elems = q.blocks as f64 * 256.0 * 4.0;
        let mut two = q;
        two.blocks = 132 * 16;
        two.elems = two.blocks as f64 * 256.0 * 4.0;
        let (a, b) = (estimate(&H200, &q), estimate(&H200, &two));
        assert!((a.seconds - b.seconds).abs() < 1e-15);
    }

    #[test]
    fn prefetching_overlaps_the_load_chain_with_compute() {
        let mut p = phase();
        p.bar = 2.0;
        p.shfl = 10.0;
        p.instrs_per_round = 400.0;
        let m = H200;
        let plain = estimate(&m, &p);
        p.prefetch_rounds = 2.0;
        let e = estimate(&m, &p);
        let unit = 256.0 * 4.0 * 4.0 / m.copy_bytes_per_cycle_sm();
        let sync = 10.0 * m.shfl_latency + 2.0 * m.bar_latency;
        let want = ((m.dram_latency + unit) / 2.0)
            .max(sync + e.issue_cycles)
            .max(e.transfer_cycles);
        assert!((e.round_cycles - want).abs() < 1e-9);
        assert!(e.round_cycles < plain.round_cycles);
        // Compute-bound: prefetching cannot go below the compute.
        p.instrs_per_round = 40_000.0;
        let e = estimate(&m, &p);
        assert!((e.round_cycles - (sync + e.issue_cycles)).abs() < 1e-9);
    }

    #[test]
    fn an_l2_pass_pays_l2_latency_and_no_dram_time() {
        let mut p = phase();
        p.bytes_per_elem = 0.0;
        p.read_bytes_per_elem = 0.0;
        p.l2_read_bytes_per_elem = 4.0;
        let e = estimate(&H200, &p);
        assert_eq!(e.memory_cycles, H200.l2_latency);
        assert_eq!(e.fraction, 0.0);
        assert!(e.seconds > 0.0);
    }
}
