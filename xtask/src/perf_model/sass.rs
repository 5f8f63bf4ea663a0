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
    pub mufu: u32,
    pub shared: u32,
    /// Groups of global loads separated by a shuffle or barrier: each group
    /// is one dependent memory round trip.
    pub load_groups: u32,
    /// Global bytes moved by accesses of the region's widest load width.
    pub wide_bytes: u32,
    sync_since_load: bool,
}

impl PathStats {
    fn add(mut self, i: &Instr, width: u32) -> Self {
        self.instrs += 1;
        let base = i.base();
        if let Some(b) = i.global_load_bytes().or(i.global_store_bytes()) {
            if b == width {
                self.wide_bytes += b;
            }
        }
        if let Some(b) = i.global_load_bytes() {
            self.ldg += 1;
            self.ldg_bytes += b;
            self.widest_load = self.widest_load.max(b);
            if self.load_groups == 0 || self.sync_since_load {
                self.load_groups += 1;
            }
            self.sync_since_load = false;
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
            "MUFU" => self.mufu += 1,
            "LDS" | "STS" => self.shared += 1,
            _ => {}
        }
        self
    }

    /// The hot path: the one that moves the most bytes with the region's
    /// widest accesses (the vector data path, not an early exit, a skipped
    /// branch or an element-by-element tail), and among those the shortest
    /// (slow paths such as division special cases are skipped).
    fn better_than(&self, o: &PathStats) -> bool {
        self.wide_bytes > o.wide_bytes
            || (self.wide_bytes == o.wide_bytes && self.instrs < o.instrs)
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
            .filter_map(|i| i.global_load_bytes())
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
        assert_eq!(fs.len(), 2);
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
        assert_eq!(s.ldg_bytes, 8);
        assert_eq!(s.stg_bytes, 4);
    }
}
