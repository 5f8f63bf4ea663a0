//! Pipeline schedules: every allowed configuration (pp ≤ 8, vp ≤ 4,
//! m ≤ 32, every group) is checked for coverage and order, message shape,
//! send/receive pairing in NCCL posting order, and deadlock freedom under
//! blocking receives and non-blocking sends; makespans under unit costs;
//! warm-up counts; the named errors; and the checker itself rejects
//! mutated schedules.

use std::collections::HashMap;

use ferrotron::core::pipeline::schedule::interleaved_table;
use ferrotron::core::pipeline::{
    schedule, Message, Op, Pass, Payload, PipelineConfig, ScheduleKind,
};

fn cfg(pp: usize, m: usize, kind: ScheduleKind) -> PipelineConfig {
    PipelineConfig {
        pp,
        microbatches: m,
        kind,
    }
}

fn vp_of(kind: ScheduleKind) -> usize {
    match kind {
        ScheduleKind::Interleaved { vp, .. } => vp,
        _ => 1,
    }
}

/// The rules, written again independently of the library.
fn allowed(pp: usize, m: usize, kind: ScheduleKind) -> bool {
    if pp < 1 || m < 1 {
        return false;
    }
    match kind {
        ScheduleKind::NoPipelining => pp == 1,
        ScheduleKind::OneFOneB | ScheduleKind::ZeroBubbleH1 => true,
        ScheduleKind::Interleaved { vp, group } => {
            if vp < 1 {
                return false;
            }
            if vp == 1 {
                return true;
            }
            let g = group.unwrap_or(pp);
            pp >= 2
                && m >= pp
                && pp <= g
                && g <= m
                && (pp != 2 || g == 2)
                && (m % g == 0 || m % g >= pp)
        }
    }
}

/// The messages an op must carry, derived from its stage alone.
fn expected_messages(op: &Op, pp: usize, vp: usize) -> (Option<Message>, Option<Message>) {
    let s = op.stage;
    let last = pp * vp - 1;
    let m = |payload, peer_stage: usize, from_stage| Message {
        peer: peer_stage % pp,
        payload,
        microbatch: op.microbatch,
        from_stage,
    };
    match op.pass {
        Pass::Forward => (
            (s > 0).then(|| m(Payload::Activation, s - 1, s - 1)),
            (s < last).then(|| m(Payload::Activation, s + 1, s)),
        ),
        Pass::Backward | Pass::BackwardInput => (
            (s < last).then(|| m(Payload::Gradient, s + 1, s + 1)),
            (s > 0).then(|| m(Payload::Gradient, s - 1, s)),
        ),
        Pass::BackwardWeight => (None, None),
    }
}

/// (a) Every (stage, micro-batch) runs its passes exactly once, in order
/// (F before B before W on the owning rank), every op sits on the rank and
/// chunk of its stage and carries the messages of its stage.
fn check_coverage(c: &PipelineConfig, s: &[Vec<Op>]) -> Result<(), String> {
    let (pp, m, vp) = (c.pp, c.microbatches, vp_of(c.kind));
    if s.len() != pp {
        return Err(format!("{} ranks, expected {pp}", s.len()));
    }
    let split = matches!(c.kind, ScheduleKind::ZeroBubbleH1);
    let passes: &[Pass] = if split {
        &[Pass::Forward, Pass::BackwardInput, Pass::BackwardWeight]
    } else {
        &[Pass::Forward, Pass::Backward]
    };
    // (stage, mb, pass index) -> position in the rank's list
    let mut seen: HashMap<(usize, usize, usize), usize> = HashMap::new();
    for (rank, ops) in s.iter().enumerate() {
        for (i, op) in ops.iter().enumerate() {
            let Some(p) = passes.iter().position(|&p| p == op.pass) else {
                return Err(format!("rank {rank} op {i}: unexpected pass {:?}", op.pass));
            };
            if op.chunk >= vp || op.stage != op.chunk * pp + rank || op.microbatch >= m {
                return Err(format!("rank {rank} op {i}: bad placement {op:?}"));
            }
            let (recv, send) = expected_messages(op, pp, vp);
            if op.recv != recv || op.send != send {
                return Err(format!(
                    "rank {rank} op {i}: messages {:?}/{:?}, expected {recv:?}/{send:?}",
                    op.recv, op.send
                ));
            }
            if seen.insert((op.stage, op.microbatch, p), i).is_some() {
                return Err(format!("rank {rank} op {i}: {op:?} runs twice"));
            }
        }
    }
    for stage in 0..pp * vp {
        for mb in 0..m {
            let mut prev = None;
            for (p, pass) in passes.iter().enumerate() {
                let Some(&pos) = seen.get(&(stage, mb, p)) else {
                    return Err(format!("stage {stage} mb {mb}: {pass:?} missing"));
                };
                if let Some(q) = prev {
                    if pos < q {
                        return Err(format!(
                            "stage {stage} mb {mb}: {pass:?} at {pos} before {:?} at {q}",
                            passes[p - 1]
                        ));
                    }
                }
                prev = Some(pos);
            }
        }
    }
    Ok(())
}

/// What identifies a message: payload, micro-batch, sending stage.
type Key = (Payload, usize, usize);

/// (b) Per (sender, receiver) pair, the k-th send matches the k-th receive
/// (payload, micro-batch, sending stage), and the counts agree.
fn check_pairing(pp: usize, s: &[Vec<Op>]) -> Result<(), String> {
    let mut sends: HashMap<(usize, usize), Vec<Key>> = HashMap::new();
    let mut recvs: HashMap<(usize, usize), Vec<Key>> = HashMap::new();
    for (rank, ops) in s.iter().enumerate() {
        for op in ops {
            if let Some(x) = op.send {
                sends.entry((rank, x.peer)).or_default().push((
                    x.payload,
                    x.microbatch,
                    x.from_stage,
                ));
            }
            if let Some(x) = op.recv {
                recvs.entry((x.peer, rank)).or_default().push((
                    x.payload,
                    x.microbatch,
                    x.from_stage,
                ));
            }
        }
    }
    for a in 0..pp {
        for b in 0..pp {
            let empty = Vec::new();
            let sa = sends.get(&(a, b)).unwrap_or(&empty);
            let rb = recvs.get(&(a, b)).unwrap_or(&empty);
            for (k, (x, y)) in sa.iter().zip(rb).enumerate() {
                if x != y {
                    return Err(format!(
                        "rank {a} -> rank {b}: send #{k} is {x:?} but receive #{k} expects {y:?}"
                    ));
                }
            }
            if sa.len() != rb.len() {
                return Err(format!(
                    "rank {a} -> rank {b}: {} sends but {} receives",
                    sa.len(),
                    rb.len()
                ));
            }
        }
    }
    Ok(())
}

/// (c) Runs the ranks with blocking receives (an op waits until the
/// matching send's op has run, matched per pair in posting order) and
/// non-blocking sends; list scheduling with `cost(pass)` and no latency.
/// Returns the makespan, or the ops every unfinished rank waits at.
fn run(s: &[Vec<Op>], cost: impl Fn(Pass) -> u64) -> Result<u64, String> {
    let pp = s.len();
    let mut idx = vec![0usize; pp];
    let mut free = vec![0u64; pp];
    // end times of the sends from a to b, in posting order; receives taken
    let mut sent: Vec<Vec<Vec<u64>>> = vec![vec![Vec::new(); pp]; pp];
    let mut taken = vec![vec![0usize; pp]; pp];
    loop {
        let mut progress = false;
        for r in 0..pp {
            while let Some(op) = s[r].get(idx[r]) {
                let mut start = free[r];
                if let Some(x) = op.recv {
                    let a = x.peer;
                    let Some(&t) = sent[a][r].get(taken[a][r]) else {
                        break;
                    };
                    taken[a][r] += 1;
                    start = start.max(t);
                }
                let end = start + cost(op.pass);
                if let Some(x) = op.send {
                    sent[r][x.peer].push(end);
                }
                free[r] = end;
                idx[r] += 1;
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    let stuck: Vec<String> = (0..pp)
        .filter(|&r| idx[r] < s[r].len())
        .map(|r| format!("rank {r} at op {} {:?}", idx[r], s[r][idx[r]]))
        .collect();
    if !stuck.is_empty() {
        return Err(format!("deadlock: {}", stuck.join("; ")));
    }
    Ok(free.into_iter().max().unwrap_or(0))
}

fn check_all(c: &PipelineConfig, s: &[Vec<Op>]) -> Result<(), String> {
    check_coverage(c, s)?;
    check_pairing(c.pp, s)?;
    run(s, |_| 1)?;
    Ok(())
}

/// Peak of micro-batches between F and B (or B-input) on each rank.
fn peak_in_flight(ops: &[Op]) -> usize {
    let (mut cur, mut peak) = (0usize, 0usize);
    for op in ops {
        match op.pass {
            Pass::Forward => {
                cur += 1;
                peak = peak.max(cur);
            }
            Pass::Backward | Pass::BackwardInput => cur -= 1,
            Pass::BackwardWeight => {}
        }
    }
    peak
}

fn unit(pass: Pass) -> u64 {
    match pass {
        Pass::Forward => 1,
        Pass::Backward => 2,
        Pass::BackwardInput | Pass::BackwardWeight => 1,
    }
}

fn all_kinds(m: usize) -> Vec<ScheduleKind> {
    let mut kinds = vec![
        ScheduleKind::NoPipelining,
        ScheduleKind::OneFOneB,
        ScheduleKind::ZeroBubbleH1,
        ScheduleKind::Interleaved { vp: 1, group: None },
    ];
    for vp in 2..=4 {
        kinds.push(ScheduleKind::Interleaved { vp, group: None });
        for g in 1..=m + 1 {
            kinds.push(ScheduleKind::Interleaved { vp, group: Some(g) });
        }
    }
    kinds
}

#[test]
fn every_configuration_is_complete_paired_and_deadlock_free() {
    let mut checked = 0usize;
    let mut rejected = 0usize;
    let mut per_kind: HashMap<&str, usize> = HashMap::new();
    let mut failures = Vec::new();
    for pp in 1..=8 {
        for m in 1..=32 {
            for kind in all_kinds(m) {
                let c = cfg(pp, m, kind);
                let result = schedule(&c);
                if !allowed(pp, m, kind) {
                    assert!(result.is_err(), "{c:?} must be rejected");
                    rejected += 1;
                    continue;
                }
                let s = result.unwrap_or_else(|e| panic!("{c:?}: {e}"));
                if let Err(e) = check_all(&c, &s) {
                    failures.push(format!("{c:?}: {e}"));
                    continue;
                }
                let name = match kind {
                    ScheduleKind::NoPipelining => "NoPipelining",
                    ScheduleKind::OneFOneB => "OneFOneB",
                    ScheduleKind::ZeroBubbleH1 => "ZeroBubbleH1",
                    ScheduleKind::Interleaved { .. } => "Interleaved",
                };
                *per_kind.entry(name).or_default() += 1;
                checked += 1;
            }
        }
    }
    let mut kinds: Vec<_> = per_kind.into_iter().collect();
    kinds.sort();
    eprintln!(
        "pipeline schedules: {checked} configurations checked (coverage, pairing, deadlock), \
         {rejected} rejected by the rules; per kind: {kinds:?}"
    );
    assert!(
        failures.is_empty(),
        "{} configurations fail, e.g.:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
    assert!(checked > 4_000, "{checked}");
}

#[test]
fn zero_bubble_h1_makespan_and_memory() {
    let mut n = 0;
    for pp in 1..=8 {
        for m in 1..=32 {
            let c = cfg(pp, m, ScheduleKind::ZeroBubbleH1);
            let s = schedule(&c).unwrap();
            let makespan = run(&s, |_| 1).unwrap();
            // m >= pp: the ZB-H1 target 3m + pp - 1 (bubble (pp - 1) / 3m);
            // m < pp: the chains of the last micro-batch, 2m + 2pp - 1.
            let expected = if m >= pp {
                3 * m + pp - 1
            } else {
                2 * m + 2 * pp - 1
            };
            assert_eq!(makespan as usize, expected, "pp {pp} m {m}");
            for (r, ops) in s.iter().enumerate() {
                assert!(peak_in_flight(ops) <= pp - r, "pp {pp} m {m} rank {r}");
            }
            n += 1;
        }
    }
    eprintln!("ZB-H1: makespan 3m + pp - 1 (m >= pp), 2m + 2pp - 1 (m < pp): {n} configurations");
}

#[test]
fn one_f_one_b_makespan_memory_and_warmup() {
    for pp in 1..=8 {
        for m in 1..=32 {
            let c = cfg(pp, m, ScheduleKind::OneFOneB);
            let s = schedule(&c).unwrap();
            // F = 1, B = 2: (m + pp - 1) · 3.
            assert_eq!(run(&s, unit).unwrap() as usize, 3 * (m + pp - 1));
            for (r, ops) in s.iter().enumerate() {
                let w = (pp - r - 1).min(m);
                assert_eq!(c.warmup_forwards(r).unwrap(), w);
                let leading = ops.iter().take_while(|o| o.pass == Pass::Forward).count();
                // the warm-up, plus the steady state's first forward if any
                assert_eq!(leading, (w + 1).min(m), "pp {pp} m {m} rank {r}");
                assert!(peak_in_flight(ops) <= pp - r);
            }
            // vp = 1 interleaved is exactly 1F1B.
            let i1 = cfg(pp, m, ScheduleKind::Interleaved { vp: 1, group: None });
            assert_eq!(schedule(&i1).unwrap(), s);
        }
    }
}

#[test]
fn no_pipelining_is_gradient_accumulation() {
    let s = schedule(&cfg(1, 3, ScheduleKind::NoPipelining)).unwrap();
    let got: Vec<_> = s[0].iter().map(|o| (o.pass, o.microbatch)).collect();
    use Pass::*;
    assert_eq!(
        got,
        [
            (Forward, 0),
            (Backward, 0),
            (Forward, 1),
            (Backward, 1),
            (Forward, 2),
            (Backward, 2)
        ]
    );
    assert!(s[0].iter().all(|o| o.recv.is_none() && o.send.is_none()));
}

#[test]
fn interleaved_warmup_order_and_makespan() {
    for pp in 2..=8 {
        for vp in 2..=4 {
            for m in pp..=32 {
                for g in pp..=m {
                    let kind = ScheduleKind::Interleaved { vp, group: Some(g) };
                    if !allowed(pp, m, kind) {
                        continue;
                    }
                    let c = cfg(pp, m, kind);
                    let s = schedule(&c).unwrap();
                    let table = interleaved_table(m, vp, g);
                    for (r, ops) in s.iter().enumerate() {
                        let w = ((pp - r - 1) * 2 + (vp - 1) * g).min(m * vp);
                        assert_eq!(c.warmup_forwards(r).unwrap(), w);
                        let leading = ops.iter().take_while(|o| o.pass == Pass::Forward).count();
                        assert_eq!(leading, (w + 1).min(m * vp), "{c:?} rank {r}");
                        let f: Vec<_> = ops
                            .iter()
                            .filter(|o| o.pass == Pass::Forward)
                            .map(|o| (o.chunk, o.microbatch))
                            .collect();
                        assert_eq!(f, table);
                        let b: Vec<_> = ops
                            .iter()
                            .filter(|o| o.pass == Pass::Backward)
                            .map(|o| (vp - 1 - o.chunk, o.microbatch))
                            .collect();
                        assert_eq!(b, table);
                    }
                    // Interleaving shrinks the bubble: per-chunk costs F = 1,
                    // B = 2 against 1F1B with F = vp, B = 2·vp.
                    let makespan = run(&s, unit).unwrap() as usize;
                    let ideal = 3 * m * vp;
                    let plain = 3 * (m + pp - 1) * vp;
                    assert!(makespan >= ideal && makespan < plain, "{c:?}: {makespan}");
                    if g == pp && m % pp == 0 {
                        // Megatron's bubble: (pp - 1) · (F + B) per chunk.
                        assert_eq!(makespan, ideal + 3 * (pp - 1), "{c:?}");
                    }
                }
            }
        }
    }
    // Default group = pp.
    let a = schedule(&cfg(4, 8, ScheduleKind::Interleaved { vp: 2, group: None })).unwrap();
    let b = schedule(&cfg(
        4,
        8,
        ScheduleKind::Interleaved {
            vp: 2,
            group: Some(4),
        },
    ))
    .unwrap();
    assert_eq!(a, b);
    // m = 6, group = 4, pp = 2: groups {0..4}, {4, 5}.
    assert_eq!(
        interleaved_table(6, 2, 4),
        [
            (0, 0),
            (0, 1),
            (0, 2),
            (0, 3),
            (1, 0),
            (1, 1),
            (1, 2),
            (1, 3),
            (0, 4),
            (0, 5),
            (1, 4),
            (1, 5)
        ]
    );
}

fn err(pp: usize, m: usize, kind: ScheduleKind) -> String {
    match schedule(&cfg(pp, m, kind)) {
        Ok(_) => panic!("pp {pp} m {m} {kind:?} must fail"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn each_rule_has_its_named_error() {
    let il = |vp, group| ScheduleKind::Interleaved { vp, group };
    let cases: Vec<(String, &[&str])> = vec![
        (
            err(0, 4, ScheduleKind::OneFOneB),
            &["pipeline schedule", "`pp`", ">= 1", "got 0"],
        ),
        (
            err(2, 0, ScheduleKind::ZeroBubbleH1),
            &["`microbatches`", ">= 1", "got 0"],
        ),
        (
            err(2, 4, ScheduleKind::NoPipelining),
            &["`pp`", "1 for NoPipelining", "got 2"],
        ),
        (err(2, 4, il(0, None)), &["`vp`", ">= 1", "got 0"]),
        (err(1, 4, il(2, None)), &["`pp`", ">= 2", "vp = 2", "got 1"]),
        (
            err(4, 3, il(2, None)),
            &["`microbatches`", ">= pp = 4", "got 3"],
        ),
        (
            err(4, 8, il(2, Some(3))),
            &["`group`", ">= pp = 4", "got 3"],
        ),
        (
            err(4, 8, il(2, Some(9))),
            &["`group`", "<= microbatches = 8", "got 9"],
        ),
        (
            err(2, 8, il(2, Some(4))),
            &["`group`", "2 (= pp) when pp = 2", "got 4"],
        ),
        (
            err(2, 7, il(3, None)),
            &[
                "`microbatches`",
                "multiple of group = 2",
                "microbatches % group = 1",
            ],
        ),
        (
            err(4, 10, il(2, Some(4))),
            &[
                "`microbatches`",
                "multiple of group = 4",
                "microbatches % group = 2",
            ],
        ),
    ];
    for (msg, needles) in &cases {
        for n in *needles {
            assert!(msg.contains(n), "{msg:?} lacks {n:?}");
        }
    }
    // The remainder rule accepts a last group of >= pp micro-batches.
    assert!(schedule(&cfg(4, 11, il(2, Some(7)))).is_ok());
    assert!(schedule(&cfg(4, 10, il(2, Some(6)))).is_ok());
    // vp = 1 ignores the group and allows m < pp, as 1F1B.
    assert!(schedule(&cfg(4, 2, il(1, Some(100)))).is_ok());
    // warmup_forwards checks the rank.
    let e = cfg(4, 8, ScheduleKind::OneFOneB)
        .warmup_forwards(4)
        .unwrap_err();
    assert!(e.to_string().contains("`rank`"), "{e}");
}

#[test]
fn the_checker_rejects_mutated_schedules() {
    let c = cfg(4, 8, ScheduleKind::OneFOneB);
    let good = schedule(&c).unwrap();
    check_all(&c, &good).unwrap();

    // Dropping a receive: the pairing no longer balances.
    let mut s = good.clone();
    let i = s[2].iter().rposition(|o| o.recv.is_some()).unwrap();
    s[2][i].recv = None;
    let e = check_pairing(4, &s).unwrap_err();
    assert!(e.contains("sends but"), "{e}");
    assert!(check_coverage(&c, &s).is_err());

    // Swapping two forwards of rank 1: receive order differs from send order.
    let mut s = good.clone();
    s[1].swap(0, 1);
    check_coverage(&c, &s).unwrap();
    let e = check_pairing(4, &s).unwrap_err();
    assert!(e.contains("send #0"), "{e}");

    // Swapping a forward with its own backward: order violated.
    let mut s = good.clone();
    let f = s[3].iter().position(|o| o.pass == Pass::Forward).unwrap();
    let b = s[3].iter().position(|o| o.pass == Pass::Backward).unwrap();
    s[3].swap(f, b);
    let e = check_coverage(&c, &s).unwrap_err();
    assert!(e.contains("before"), "{e}");

    // A ZB-H1 W moved before its B.
    let z = cfg(3, 6, ScheduleKind::ZeroBubbleH1);
    let mut s = schedule(&z).unwrap();
    check_all(&z, &s).unwrap();
    let w = s[0]
        .iter()
        .position(|o| o.pass == Pass::BackwardWeight)
        .unwrap();
    let op = s[0].remove(w);
    s[0].insert(0, op);
    assert!(check_coverage(&z, &s).unwrap_err().contains("before"));

    // Complete and paired but deadlocking: the last rank of 1F1B (pp 2,
    // m 3) runs all forwards first while rank 0 waits for a gradient
    // before sending the third activation.
    let c = cfg(2, 3, ScheduleKind::OneFOneB);
    let mut s = schedule(&c).unwrap();
    check_all(&c, &s).unwrap();
    s[1].sort_by_key(|o| (o.pass != Pass::Forward, o.microbatch));
    check_coverage(&c, &s).unwrap();
    check_pairing(2, &s).unwrap();
    let e = run(&s, |_| 1).unwrap_err();
    assert!(e.starts_with("deadlock"), "{e}");
}

/// A grouped plan moves every message exactly once, sends it after the
/// operation that computes it, receives it before the operation that needs
/// it, and keeps each (sender, receiver) pair's order on both sides (how
/// NCCL matches point-to-point transfers).
fn check_plan_covers(
    s: &[Vec<Op>],
    plan: &[Vec<ferrotron::core::pipeline::P2pGroup>],
) -> Result<(), String> {
    for (r, (ops, groups)) in s.iter().zip(plan).enumerate() {
        let mut sent = Vec::new();
        let mut got = Vec::new();
        for g in groups {
            for &(op, m) in &g.sends {
                if op >= g.before || ops[op].send != Some(m) {
                    return Err(format!(
                        "rank {r}: send of op {op} in the group before {}",
                        g.before
                    ));
                }
                sent.push(op);
            }
            for &(op, m) in &g.recvs {
                if op < g.before || ops[op].recv != Some(m) {
                    return Err(format!(
                        "rank {r}: recv of op {op} in the group before {}",
                        g.before
                    ));
                }
                got.push(op);
            }
        }
        let want_sent: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].send.is_some()).collect();
        let want_got: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].recv.is_some()).collect();
        // Sends and receives in operation order overall imply each pair's
        // order is the schedule's, which check_pairing proved consistent.
        let per_peer = |v: &[usize], f: &dyn Fn(usize) -> usize| {
            let mut m: HashMap<usize, Vec<usize>> = HashMap::new();
            for &i in v {
                m.entry(f(i)).or_default().push(i);
            }
            m
        };
        let send_peer = |i: usize| ops[i].send.map_or(usize::MAX, |m| m.peer);
        let recv_peer = |i: usize| ops[i].recv.map_or(usize::MAX, |m| m.peer);
        let mut sorted = sent.clone();
        sorted.sort_unstable();
        if sorted != want_sent || per_peer(&sent, &send_peer) != per_peer(&want_sent, &send_peer) {
            return Err(format!(
                "rank {r}: sends missing, repeated or out of pair order"
            ));
        }
        let mut sorted = got.clone();
        sorted.sort_unstable();
        if sorted != want_got || per_peer(&got, &recv_peer) != per_peer(&want_got, &recv_peer) {
            return Err(format!(
                "rank {r}: receives missing, repeated or out of pair order"
            ));
        }
    }
    Ok(())
}

/// Every configuration the rules allow (pp ≤ 8, m ≤ 32, every kind).
fn allowed_configs() -> Vec<PipelineConfig> {
    let mut out = Vec::new();
    for pp in 1..=8 {
        for m in 1..=32 {
            for kind in all_kinds(m) {
                if allowed(pp, m, kind) {
                    out.push(cfg(pp, m, kind));
                }
            }
        }
    }
    out
}

#[test]
fn every_configuration_is_deadlock_free_with_grouped_rendezvous_transfers() {
    use ferrotron::core::pipeline::{check_grouped, grouped_transfers};
    let mut checked = 0usize;
    let mut failures = Vec::new();
    for c in allowed_configs() {
        let kind = c.kind;
        let s = schedule(&c).unwrap();
        let checked_plan = grouped_transfers(&s)
            .map_err(|e| e.to_string())
            .and_then(|p| check_grouped(&p).map(|()| p).map_err(|e| e.to_string()))
            .and_then(|p| check_plan_covers(&s, &p).map(|()| p));
        if let Err(e) = checked_plan {
            let name = match kind {
                ScheduleKind::NoPipelining => "NoPipelining",
                ScheduleKind::OneFOneB => "OneFOneB",
                ScheduleKind::ZeroBubbleH1 => "ZeroBubbleH1",
                ScheduleKind::Interleaved { .. } => "Interleaved",
            };
            failures.push(format!("{name} {c:?}: {e}"));
        }
        checked += 1;
    }
    let mut by_kind: HashMap<&str, usize> = HashMap::new();
    for f in &failures {
        *by_kind
            .entry(f.split(' ').next().unwrap_or(""))
            .or_default() += 1;
    }
    eprintln!(
        "grouped transfers: {checked} configurations, {} deadlock: {by_kind:?}",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} configurations deadlock, e.g.:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}

/// The checker can fail: one group per operation boundary (the previous
/// send with this receive, Megatron's non-interleaved pairing) deadlocks
/// the interleaved schedule at pp = 2 under rendezvous transfers — both
/// ranks send a gradient the other has not posted a receive for yet.
#[test]
fn grouped_checker_rejects_the_naive_interleaved_pairing() {
    use ferrotron::core::pipeline::{check_grouped, grouped_transfers, P2pGroup};
    let c = cfg(2, 4, ScheduleKind::Interleaved { vp: 2, group: None });
    let s = schedule(&c).unwrap();
    let naive: Vec<Vec<P2pGroup>> = s
        .iter()
        .map(|ops| {
            (0..=ops.len())
                .map(|i| P2pGroup {
                    before: i,
                    sends: i
                        .checked_sub(1)
                        .and_then(|p| ops[p].send.map(|m| (p, m)))
                        .into_iter()
                        .collect(),
                    recvs: ops
                        .get(i)
                        .and_then(|o| o.recv.map(|m| (i, m)))
                        .into_iter()
                        .collect(),
                })
                .filter(|g| !g.sends.is_empty() || !g.recvs.is_empty())
                .collect()
        })
        .collect();
    let e = check_grouped(&naive).unwrap_err().to_string();
    assert!(e.contains("rank 0") && e.contains("rank 1"), "{e}");
    let planned = grouped_transfers(&s).unwrap();
    check_grouped(&planned).unwrap();
    assert_ne!(planned, naive, "the planner must have repaired something");
}

/// Forward-only runs (evaluation): for every allowed configuration, each
/// (stage, micro-batch) forward runs exactly once on its rank, in the full
/// schedule's order, with the full schedule's messages; sends and receives
/// pair up; and the ranks finish both with buffered sends and with the
/// grouped rendezvous plan.
#[test]
fn forward_only_runs_are_complete_paired_and_deadlock_free() {
    use ferrotron::core::pipeline::{check_grouped, forward_only, grouped_transfers};
    let mut checked = 0usize;
    let mut failures = Vec::new();
    for c in allowed_configs() {
        let (pp, kind) = (c.pp, c.kind);
        let full = schedule(&c).unwrap();
        let s = forward_only(&full);
        let vp = vp_of(kind);
        let result = (|| -> Result<(), String> {
            let mut seen = HashMap::new();
            for (rank, ops) in s.iter().enumerate() {
                let want: Vec<&Op> = full[rank]
                    .iter()
                    .filter(|o| o.pass == Pass::Forward)
                    .collect();
                if ops.iter().collect::<Vec<_>>() != want {
                    return Err(format!("rank {rank}: not the full schedule's forwards"));
                }
                for op in ops {
                    if op.pass != Pass::Forward
                        || (op.recv, op.send) != expected_messages(op, pp, vp)
                    {
                        return Err(format!("rank {rank}: {op:?}"));
                    }
                    *seen.entry((op.stage, op.microbatch)).or_insert(0) += 1;
                }
            }
            if seen.len() != pp * vp * c.microbatches || seen.values().any(|&n| n != 1) {
                return Err(format!("{} forwards, not each once", seen.len()));
            }
            check_pairing(pp, &s)?;
            run(&s, |_| 1)?;
            let plan = grouped_transfers(&s).map_err(|e| e.to_string())?;
            check_grouped(&plan).map_err(|e| e.to_string())?;
            check_plan_covers(&s, &plan)
        })();
        if let Err(e) = result {
            failures.push(format!("{c:?}: {e}"));
        }
        checked += 1;
    }
    eprintln!("forward-only runs: {checked} configurations checked");
    assert!(
        failures.is_empty(),
        "{} configurations fail, e.g.:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
    assert!(checked > 4_000, "{checked}");
}
