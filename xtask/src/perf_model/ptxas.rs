//! Parser for ptxas' `-v` resource report (what `build.rs` keeps in
//! `ptxas-report.txt`): registers, static shared memory, barriers and spills
//! per kernel and target.

use std::collections::HashMap;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub registers: u32,
    pub smem_bytes: u32,
    pub barriers: u32,
    pub stack_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
}

/// `(kernel, arch) -> resources` for every entry function in the report.
pub fn parse(report: &str) -> HashMap<(String, String), Resources> {
    let mut out = HashMap::new();
    let mut current: Option<(String, String)> = None;
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let mut parts = rest.split('\'');
            let name = parts.next().unwrap_or("").to_string();
            let arch = parts.nth(1).unwrap_or("").to_string();
            out.insert((name.clone(), arch.clone()), Resources::default());
            current = Some((name, arch));
            continue;
        }
        let Some(key) = current.as_ref() else {
            continue;
        };
        let Some(r) = out.get_mut(key) else { continue };
        if line.contains("bytes stack frame") {
            let n = numbers(line);
            if n.len() >= 3 {
                (r.stack_bytes, r.spill_stores, r.spill_loads) = (n[0], n[1], n[2]);
            }
        } else if line.contains("Used ") && line.contains("registers") {
            let field = |unit: &str| {
                line.split(',')
                    .find(|f| f.contains(unit))
                    .and_then(|f| numbers(f).first().copied())
                    .unwrap_or(0)
            };
            r.registers = field("registers");
            r.barriers = field("barriers");
            r.smem_bytes = field("bytes smem");
        }
    }
    out
}

fn numbers(s: &str) -> Vec<u32> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter_map(|t| t.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("fixtures/ptxas.txt");

    #[test]
    fn parses_every_entry() {
        let m = parse(FIXTURE);
        assert_eq!(m.len(), 3);
        let k = |n: &str, a: &str| m[&(n.to_string(), a.to_string())];
        let fwd = k("ftn_bias_gelu_fwd_bf16", "sm_90a");
        assert_eq!(fwd.registers, 44);
        assert_eq!(fwd.smem_bytes, 0);
        assert_eq!(fwd.barriers, 0);
        let sm = k("ftn_softmax_fwd_block_bf16", "sm_90a");
        assert_eq!((sm.registers, sm.barriers, sm.smem_bytes), (128, 1, 256));
        let sp = k("ftn_spilling", "sm_80");
        assert_eq!(
            (sp.stack_bytes, sp.spill_stores, sp.spill_loads),
            (24, 8, 12)
        );
    }
}
