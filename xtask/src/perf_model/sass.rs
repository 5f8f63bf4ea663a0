//! Parser for `nvdisasm -g -c` output (SASS with source-line comments) and the
//! static analysis the model needs: per-function instruction lists, loops
//! (backward branches) and the instruction mix along the hot path of a region.

use std::collections::HashMap;

/// One SASS instruction.
#[derive(Clone, Debug, PartialEq)]
pub struct Instr {
    pub addr: u32,
    /// `@P0`, `@!P1`, ... (None: always executed).
    pub pred: Option<String>,
    /// The opcode with its modifiers, e.g. `LDG.E.128.CONSTANT`.
    pub op: String,
    pub operands: String,
    /// The source file and line the instruction is attributed to.
    pub file: String,
    pub line: u32,
}

impl Instr {
    fn base(&self) -> &str {
        self.op.split('.').next().unwrap_or("")
    }

    /// Bytes one thread moves with this global load, if it is one.
    pub fn global_load_bytes(&self) -> Option<u32> {
        matches!(self.base(), "LDG" | "LD").then(|| access_bytes(&self.op))
    }

    /// Bytes one thread copies from global to shared memory with this
    /// asynchronous copy (`LDGSTS`, cp.async), if it is one: a global read
    /// with no register result.
    pub fn async_copy_bytes(&self) -> Option<u32> {
        (self.base() == "LDGSTS").then(|| access_bytes(&self.op))
    }

    /// Bytes one thread reads from global memory with this load or
    /// asynchronous copy, if it is one.
    pub fn global_read_bytes(&self) -> Option<u32> {
        self.global_load_bytes().or(self.async_copy_bytes())
    }

    /// Bytes one thread moves with this global store, if it is one.
    pub fn global_store_bytes(&self) -> Option<u32> {
        matches!(self.base(), "STG" | "ST").then(|| access_bytes(&self.op))
    }

    fn branch_label(&self) -> Option<&str> {
        if self.base() != "BRA" {
            return None;
        }
        let s = self.operands.split("(").nth(1)?;
        Some(s.split(')').next()?.trim())
    }
}

/// Width of a memory access from its modifiers (`.128`, `.64`, `.U16`, ...).
pub fn access_bytes(op: &str) -> u32 {
    for m in op.split('.').skip(1) {
        match m {
            "128" => return 16,
            "64" => return 8,
            "U16" | "S16" => return 2,
            "U8" | "S8" => return 1,
            _ => {}
        }
    }
    4
}

/// One kernel's SASS.
#[derive(Clone, Debug, Default)]
pub struct Function {
    pub name: String,
    pub instrs: Vec<Instr>,
    labels: HashMap<String, usize>,
}

/// Parses the whole `nvdisasm -g -c` listing of one cubin.
pub fn parse(text: &str) -> Vec<Function> {
    let mut out: Vec<Function> = Vec::new();
    let (mut file, mut line) = (String::new(), 0u32);
    let mut pending_labels: Vec<String> = Vec::new();
    for raw in text.lines() {
        let t = raw.trim();
        if let Some(name) = t.strip_prefix(".text.").and_then(|s| s.strip_suffix(':')) {
            out.push(Function {
                name: name.to_string(),
                ..Function::default()
            });
            pending_labels.clear();
            continue;
        }
        if let Some(rest) = t.strip_prefix("//## File \"") {
            if let Some((f, l)) = rest.split_once("\", line ") {
                file = f.to_string();
                line = l
                    .split(|c: char| !c.is_ascii_digit())
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
            }
            continue;
        }
        let Some(f) = out.last_mut() else { continue };
        if t.starts_with(".L_") && t.ends_with(':') {
            pending_labels.push(t.trim_end_matches(':').to_string());
            continue;
        }
        let Some(rest) = t.strip_prefix("/*") else {
            continue;
        };
        let Some((addr, body)) = rest.split_once("*/") else {
            continue;
        };
        let Ok(addr) = u32::from_str_radix(addr.trim(), 16) else {
            continue;
        };
        let body = body.trim().trim_end_matches(';').trim();
        if body.is_empty() {
            continue;
        }
        let (pred, body) = match body.strip_prefix('@') {
            Some(b) => {
                let (p, r) = b.split_once(char::is_whitespace).unwrap_or((b, ""));
                (Some(format!("@{p}")), r.trim())
            }
            None => (None, body),
        };
        let (op, operands) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
        for l in pending_labels.drain(..) {
            f.labels.insert(l, f.instrs.len());
        }
        f.instrs.push(Instr {
            addr,
            pred,
            op: op.to_string(),
            operands: operands.trim().to_string(),
            file: file.clone(),
            line,
        });
    }
    out
}

/// The instruction mix along one path through a region, per thread.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PathStats {
    pub instrs: u32,
    pub ldg: u32,
    pub ldg_bytes: u32,
    pub stg: u32,
    pub stg_bytes: u32,
    /// Widest global load on the path (bytes).
    pub widest_load: u32,
    pub shfl: u32,
    pub bar: u32,
    /// Thread block cluster barriers (`UCGABAR_WAIT`, barrier.cluster.wait).
    pub cluster_bar: u32,
    /// Waits on an mbarrier phase (`SYNCS.PHASECHK`, mbarrier.try_wait):
    /// in the modelled loops, for another block's st.async.
    pub mbar_wait: u32,
    pub mufu: u32,
    pub shared: u32,
    /// Subroutine calls (`CALL`): the model counts one instruction for
    /// each, whatever the callee runs (e.g. a 64-bit division).
    pub calls: u32,
    /// Groups of global loads separated by a shuffle, a barrier, or the use
    /// of an earlier load's result (other than the `waited_wide` ones):
    /// each group after the first is one dependent round trip (modelled at
    /// L2 latency).
    pub load_groups: u32,
    /// Loads of the region's widest width on the path.
    pub wide_loads: u32,
    /// Bit i: the path's i-th wide load was issued only after the result of
    /// an earlier wide load was used (the thread waited for that load), with
    /// no shuffle or barrier since the path began. See `waits`.
    pub waited_wide: u64,
    /// Global bytes moved by accesses of the region's widest load width.
    pub wide_bytes: u32,
    sync_since_load: bool,
    /// Registers written by global loads issued since the last wait, split
    /// by whether the load had the region's widest width.
    pending_wide: RegSet,
    pending_narrow: RegSet,
    /// Since the last load: whether a pending wide / narrow result was used.
    used_wide: bool,
    used_narrow: bool,
}

/// What a subroutine call weighs when paths are compared (instructions):
/// more than any inline fast path it stands in for.
const CALL_COST: u32 = 100;

/// A set of general registers R0..R255 (RZ is not tracked).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct RegSet([u64; 4]);

impl RegSet {
    fn insert(&mut self, r: u32) {
        if r < 256 {
            self.0[(r / 64) as usize] |= 1 << (r % 64);
        }
    }
    fn contains(&self, r: u32) -> bool {
        r < 256 && self.0[(r / 64) as usize] & (1 << (r % 64)) != 0
    }
    fn clear(&mut self) {
        self.0 = [0; 4];
    }
}

/// The general registers one operand names: `R4` is R4, `R2.64` is R2 and
/// R3 (a 64-bit pair); `desc[UR4][R2.64+0x4]`, `-R3`, `|R5|`, `R7.reuse`,
/// `R6.H1` name the registers inside. `RZ` and uniform registers (`UR4`)
/// are none.
fn operand_regs(op: &str, out: &mut Vec<u32>) {
    let b = op.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let starts = b[i] == b'R' && (i == 0 || !b[i - 1].is_ascii_alphanumeric());
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        if j > i + 1 {
            let r: u32 = op[i + 1..j].parse().unwrap_or(u32::MAX);
            out.push(r);
            if op[j..].starts_with(".64") {
                out.push(r + 1);
            }
        }
        i = j;
    }
}

impl PathStats {
    /// The waits of `waited_wide` split by what the waiting load reads when
    /// the path's first `data_loads` wide loads read DRAM (the row or stream
    /// the kernel moves; they come first in program order) and the later
    /// ones hit a cache (gamma, beta, a bias): `(memory, l2)`. A data load
    /// issued only after an earlier data load's result was used costs one
    /// more full memory latency; a cached one, an L2 round trip.
    pub fn waits(&self, data_loads: u32) -> (u32, u32) {
        let data_mask = if data_loads >= 64 {
            u64::MAX
        } else {
            (1u64 << data_loads) - 1
        };
        (
            (self.waited_wide & data_mask).count_ones(),
            (self.waited_wide & !data_mask).count_ones(),
        )
    }

    fn add(mut self, i: &Instr, width: u32) -> Self {
        self.instrs += 1;
        let base = i.base();
        if let Some(b) = i.global_read_bytes().or(i.global_store_bytes()) {
            if b == width {
                self.wide_bytes += b;
            }
        }
        // An asynchronous copy reads global memory but writes no register:
        // nothing waits for it here (the kernel's wait_group is what the
        // phase's `prefetch_rounds` models).
        if let Some(b) = i.async_copy_bytes() {
            self.ldg += 1;
            self.ldg_bytes += b;
            self.widest_load = self.widest_load.max(b);
            return self;
        }
        // Registers this instruction reads (or overwrites: a write to a
        // register with a load in flight waits for it too). A load's first
        // operand is its destination, not a use.
        let load = i.global_load_bytes();
        let mut regs = Vec::new();
        for (k, o) in i.operands.split(',').enumerate() {
            if !(load.is_some() && k == 0) {
                operand_regs(o, &mut regs);
            }
        }
        if regs.iter().any(|&r| self.pending_wide.contains(r)) {
            self.used_wide = true;
        }
        if regs.iter().any(|&r| self.pending_narrow.contains(r)) {
            self.used_narrow = true;
        }
        if let Some(b) = load {
            self.ldg += 1;
            self.ldg_bytes += b;
            self.widest_load = self.widest_load.max(b);
            // A wide load after a use of an earlier wide one, before any
            // shuffle or barrier: `waits` decides what it costs. Any other
            // wait (after a reduction, on a narrow load): an L2 round trip.
            let wide_index = self.wide_loads;
            if b == width {
                self.wide_loads += 1;
            }
            if self.load_groups == 0 {
                self.load_groups = 1;
            } else if self.used_wide && self.load_groups == 1 && !self.sync_since_load && b == width
            {
                if wide_index < 64 {
                    self.waited_wide |= 1 << wide_index;
                }
            } else if self.sync_since_load || self.used_wide || self.used_narrow {
                self.load_groups += 1;
            }
            if self.used_wide || self.used_narrow || self.sync_since_load {
                self.pending_wide.clear();
                self.pending_narrow.clear();
            }
            self.sync_since_load = false;
            self.used_wide = false;
            self.used_narrow = false;
            let mut dst = Vec::new();
            operand_regs(i.operands.split(',').next().unwrap_or(""), &mut dst);
            if let Some(&r0) = dst.first() {
                let pending = if b == width {
                    &mut self.pending_wide
                } else {
                    &mut self.pending_narrow
                };
                for r in r0..r0 + b.div_ceil(4) {
                    pending.insert(r);
                }
            }
        } else if let Some(b) = i.global_store_bytes() {
            self.stg += 1;
            self.stg_bytes += b;
        }
        match base {
            "SHFL" => {
                self.shfl += 1;
                self.sync_since_load = true;
            }
            "BAR" => {
                self.bar += 1;
                self.sync_since_load = true;
            }
            "UCGABAR_WAIT" => {
                self.cluster_bar += 1;
                self.sync_since_load = true;
            }
            "SYNCS" if i.op.starts_with("SYNCS.PHASECHK") => {
                self.mbar_wait += 1;
                self.sync_since_load = true;
            }
            "MUFU" => self.mufu += 1,
            "CALL" => self.calls += 1,
            "LDS" | "STS" => self.shared += 1,
            _ => {}
        }
        self
    }

    /// The hot path: the one that moves the most bytes with the region's
    /// widest accesses (the vector data path, not an early exit, a skipped
    /// branch or an element-by-element tail), then the one that stores the
    /// most and makes the most shared-memory accesses (not one that skips
    /// the guarded chunks of a pass whose operands are already in registers
    /// or shared memory: a full row takes every chunk of every pass), and
    /// among those the shortest (slow paths such as division special cases
    /// are skipped).
    fn better_than(&self, o: &PathStats) -> bool {
        let work = |p: &PathStats| (p.wide_bytes, p.stg_bytes, p.shared);
        work(self) > work(o) || (work(self) == work(o) && self.cost() < o.cost())
    }

    /// Instructions, a subroutine call weighed as [`CALL_COST`]: a branch
    /// that calls a slow path (a division's special cases) is not the
    /// shorter side of the branch around it.
    fn cost(&self) -> u32 {
        self.instrs + (CALL_COST - 1) * self.calls
    }
}

impl Function {
    fn target(&self, i: usize) -> Option<usize> {
        self.instrs[i]
            .branch_label()
            .and_then(|l| self.labels.get(l).copied())
    }

    /// Loops as `(first, back_edge)` instruction indices, one per backward
    /// branch (a branch to itself, the trap after EXIT, is not a loop).
    pub fn loops(&self) -> Vec<(usize, usize)> {
        (0..self.instrs.len())
            .filter_map(|i| self.target(i).filter(|&t| t < i).map(|t| (t, i)))
            .collect()
    }

    /// Whether any instruction in `[a, b]` satisfies `f`.
    pub fn any_in(&self, a: usize, b: usize, f: impl Fn(&Instr) -> bool) -> bool {
        self.instrs[a..=b].iter().any(f)
    }

    /// The hot path from `start` to `end` (a loop's back edge) or, with
    /// `end = None`, from `start` to an EXIT. Forward edges only: an inner
    /// loop counts once; a CALL counts as one instruction. The hot path is
    /// ranked by the bytes its accesses of the region's widest load move.
    pub fn hot_path(&self, start: usize, end: Option<usize>) -> Option<PathStats> {
        let last = end.unwrap_or(self.instrs.len().saturating_sub(1));
        let width = self.instrs[start..=last]
            .iter()
            .filter_map(|i| i.global_read_bytes())
            .max()
            .unwrap_or(0);
        let mut best: Vec<Option<PathStats>> = vec![None; last + 2];
        best[start] = Some(PathStats::default());
        let mut result: Option<PathStats> = None;
        let offer = |slot: &mut Option<PathStats>, s: PathStats| {
            if slot.as_ref().is_none_or(|o| s.better_than(o)) {
                *slot = Some(s);
            }
        };
        for i in start..=last {
            let Some(s) = best[i] else { continue };
            let ins = &self.instrs[i];
            let s = s.add(ins, width);
            // `BRA.DIV` (divergence check), `BRA.U !UP0` (uniform predicate)
            // are conditional even without a guard predicate.
            let uncond = (ins.pred.is_none() || ins.pred.as_deref() == Some("@PT"))
                && (ins.base() != "BRA" || ins.operands.starts_with('`'));
            if end == Some(i) {
                offer(&mut result, s);
                continue;
            }
            match ins.base() {
                "EXIT" | "RET" if end.is_none() => {
                    offer(&mut result, s);
                    if uncond {
                        continue;
                    }
                }
                "EXIT" | "RET" if uncond => continue,
                "BRA" => {
                    if let Some(t) = self.target(i).filter(|&t| t > i && t <= last) {
                        offer(&mut best[t], s);
                    }
                    if uncond {
                        continue;
                    }
                }
                _ => {}
            }
            if i < last {
                offer(&mut best[i + 1], s);
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("fixtures/loop.sass");

    #[test]
    fn parses_functions_labels_and_lines() {
        let fs = parse(FIXTURE);
        assert_eq!(fs.len(), 3);
        let f = &fs[0];
        assert_eq!(f.name, "ftn_demo_kernel");
        assert_eq!(f.instrs[0].op, "S2R");
        assert_eq!(f.instrs[0].line, 10);
        assert!(f.instrs[0].file.ends_with("cuda/demo.cu"));
        let bra = f.instrs.iter().find(|i| i.op == "BRA").unwrap();
        assert_eq!(bra.pred.as_deref(), Some("@P1"));
        assert_eq!(bra.operands, "`(.L_x_2)");
        assert_eq!(fs[1].name, "ftn_other");
    }

    #[test]
    fn access_widths() {
        assert_eq!(access_bytes("LDG.E.128.CONSTANT"), 16);
        assert_eq!(access_bytes("STG.E.64"), 8);
        assert_eq!(access_bytes("LDG.E.U16"), 2);
        assert_eq!(access_bytes("LDG.E"), 4);
    }

    #[test]
    fn finds_the_loop_and_its_hot_path() {
        let fs = parse(FIXTURE);
        let f = &fs[0];
        let loops = f.loops();
        assert_eq!(loops.len(), 1, "{loops:?}");
        let (a, b) = loops[0];
        let s = f.hot_path(a, Some(b)).unwrap();
        // The loop body: LDG.128, two FMULs, the skipped slow path (the
        // shorter side of the branch that moves the same bytes), MUFU,
        // STG.128, ISETP, the back edge.
        assert_eq!(s.ldg, 1);
        assert_eq!(s.ldg_bytes, 16);
        assert_eq!(s.stg_bytes, 16);
        assert_eq!(s.mufu, 1);
        assert_eq!(s.instrs, 8);
        assert_eq!(s.load_groups, 1);
    }

    #[test]
    fn whole_function_path_counts_groups_and_syncs() {
        let fs = parse(FIXTURE);
        let f = &fs[1];
        assert!(f.loops().is_empty());
        let s = f.hot_path(0, None).unwrap();
        // Two loads separated by a shuffle and a barrier: two round trips;
        // the early-exit path moves nothing, so it is not the hot path.
        assert_eq!(s.load_groups, 2);
        assert_eq!(s.shfl, 1);
        assert_eq!(s.bar, 1);
        assert_eq!(s.cluster_bar, 0);
        assert_eq!(s.ldg_bytes, 8);
        assert_eq!(s.stg_bytes, 4);
    }

    fn instr(op: &str, operands: &str) -> Instr {
        Instr {
            addr: 0,
            pred: None,
            op: op.into(),
            operands: operands.into(),
            file: String::new(),
            line: 0,
        }
    }

    #[test]
    fn calls_are_counted() {
        let s = PathStats::default().add(&instr("CALL.REL.NOINC", " `($__internal_0)"), 16);
        assert_eq!((s.calls, s.instrs), (1, 1));
        // The fixture's loop calls on its slow path only: not the hot path.
        let fs = parse(FIXTURE);
        let (a, b) = fs[0].loops()[0];
        assert_eq!(fs[0].hot_path(a, Some(b)).unwrap().calls, 0);
    }

    #[test]
    fn cluster_barriers_are_counted_apart_from_block_barriers() {
        // barrier.cluster.arrive + wait: the wait is the one the thread
        // stalls on.
        let s = PathStats::default()
            .add(&instr("UCGABAR_ARV", ""), 16)
            .add(&instr("UCGABAR_WAIT", ""), 16)
            .add(&instr("BAR.SYNC.DEFER_BLOCKING", " 0x0"), 16)
            .add(&instr("SYNCS.ARRIVE.TRANS64", " RZ, [UR17], R82"), 16)
            .add(
                &instr("SYNCS.PHASECHK.TRANS64.TRYWAIT", " P0, [UR18], R80"),
                16,
            );
        assert_eq!((s.cluster_bar, s.bar, s.mbar_wait, s.instrs), (1, 1, 1, 5));
    }

    #[test]
    fn an_async_copy_reads_global_memory_and_writes_no_register() {
        let cp = instr("LDGSTS.E.BYPASS.128", " [R3], desc[UR8][R4.64]");
        assert_eq!(cp.global_read_bytes(), Some(16));
        assert_eq!(cp.global_load_bytes(), None);
        let s = PathStats::default().add(&cp, 16);
        assert_eq!(
            (s.ldg, s.ldg_bytes, s.widest_load, s.wide_bytes),
            (1, 16, 16, 16)
        );
        assert_eq!((s.wide_loads, s.load_groups), (0, 0));
        // A use of R3 (the shared address) is no wait: the load after it
        // starts the path's first load group.
        let s = s
            .add(&instr("IADD3", " R3, R3, 0x10, RZ"), 16)
            .add(&instr("LDG.E.128", " R8, desc[UR8][R6.64]"), 16);
        assert_eq!((s.load_groups, s.waited_wide), (1, 0));
    }

    #[test]
    fn operand_registers() {
        let mut r = Vec::new();
        operand_regs(" desc[UR4][R2.64+0x4]", &mut r);
        assert_eq!(r, [2, 3]);
        r.clear();
        operand_regs(" -|R17.reuse|", &mut r);
        operand_regs(" RZ", &mut r);
        operand_regs(" UR5", &mut r);
        operand_regs(" R6.H1", &mut r);
        assert_eq!(r, [17, 6]);
    }

    #[test]
    fn counts_loads_issued_after_a_wait_on_an_earlier_one() {
        let fs = parse(FIXTURE);
        let s = fs[2].hot_path(0, None).unwrap();
        // 0x30 (wide load 1) issues after 0x20 used wide load 0 (R5 is
        // inside the 128-bit R4..R7): a wait. 0x40 follows with no use in
        // between: none. 0x80 is narrow and follows uses of wide results: an
        // L2 round trip. 0xa0 follows a shuffle: another.
        assert_eq!(s.wide_loads, 4);
        assert_eq!(s.waited_wide, 0b10);
        assert_eq!(s.load_groups, 3);
        assert_eq!(s.ldg, 6);
        // Loads 0..3 read DRAM: the wait costs a memory latency; only load
        // 0 does (the rest hit a cache): an L2 round trip.
        assert_eq!(s.waits(3), (1, 0));
        assert_eq!(s.waits(1), (0, 1));
        assert_eq!(s.waits(64), (1, 0));
    }
}
