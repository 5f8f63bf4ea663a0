//! The tensor-parallel mapping primitives on TP = 1, 2, 4 ranks against the
//! unsharded tensors: each forward and backward, and the duality of the pairs.

mod common;

use common::ranks::run_ranks;
use ferrotron::parallel::mappings::Mapping;

/// Distinct integers-as-floats per (rank, row, col): sums are exact.
fn tensor(rank: usize, rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| (rank * 10_000 + i) as f32)
        .collect()
}

fn apply(
    m: Mapping,
    backward: bool,
    tp: usize,
    rows: usize,
    cols: usize,
) -> Vec<(Vec<f32>, (usize, usize))> {
    run_ranks(tp, |c| {
        let dev = c.device().clone();
        let s = c.stream().clone();
        let x = dev.upload(&tensor(c.rank(), rows, cols)).unwrap();
        let shape = if backward {
            // The backward maps the forward's output shape back.
            let shape = match m {
                Mapping::ScatterToTp => (rows, cols * tp),
                Mapping::GatherFromTp => (rows, cols / tp),
                Mapping::ScatterToSp | Mapping::ReduceScatterToSp => (rows * tp, cols),
                Mapping::GatherFromSp => (rows / tp, cols),
                _ => (rows, cols),
            };
            assert_eq!(
                m.backward_shape(rows, cols, tp).unwrap(),
                shape,
                "{m:?} backward shape"
            );
            shape
        } else {
            m.forward_shape(rows, cols, tp).unwrap()
        };
        let mut y = dev.alloc_zeros::<f32>(shape.0 * shape.1).unwrap();
        if backward {
            m.backward(&c, &s, &x, &mut y, (rows, cols)).unwrap();
        } else {
            m.forward(&c, &s, &x, &mut y, (rows, cols)).unwrap();
        }
        s.synchronize().unwrap();
        (y.to_host().unwrap(), shape)
    })
}

fn sum_over_ranks(tp: usize, rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| (0..tp).map(|r| tensor(r, rows, cols)[i]).sum())
        .collect()
}

#[test]
fn every_mapping_matches_the_unsharded_tensors() {
    let (rows, cols) = (4, 6);
    for tp in [1usize, 2] {
        let full = |r| tensor(r, rows, cols);
        // CopyToTp: forward identity, backward all-reduce.
        for (rank, (y, _)) in apply(Mapping::CopyToTp, false, tp, rows, cols)
            .into_iter()
            .enumerate()
        {
            assert_eq!(y, full(rank));
        }
        for (y, _) in apply(Mapping::CopyToTp, true, tp, rows, cols) {
            assert_eq!(y, sum_over_ranks(tp, rows, cols));
        }
        // ReduceFromTp: the dual.
        for (y, _) in apply(Mapping::ReduceFromTp, false, tp, rows, cols) {
            assert_eq!(y, sum_over_ranks(tp, rows, cols));
        }
        for (rank, (y, _)) in apply(Mapping::ReduceFromTp, true, tp, rows, cols)
            .into_iter()
            .enumerate()
        {
            assert_eq!(y, full(rank));
        }
        // ScatterToTp forward: rank r keeps columns [r*cols/tp, (r+1)*cols/tp).
        let w = cols / tp;
        for (rank, (y, shape)) in apply(Mapping::ScatterToTp, false, tp, rows, cols)
            .into_iter()
            .enumerate()
        {
            assert_eq!(shape, (rows, w));
            let want: Vec<f32> = (0..rows)
                .flat_map(|i| (0..w).map(move |j| (i, j)))
                .map(|(i, j)| full(rank)[i * cols + rank * w + j])
                .collect();
            assert_eq!(y, want, "scatter_to_tp tp={tp} rank={rank}");
        }
        // GatherFromTp forward: concatenate every rank's [rows, cols] along cols.
        for (y, shape) in apply(Mapping::GatherFromTp, false, tp, rows, cols) {
            assert_eq!(shape, (rows, cols * tp));
            let want: Vec<f32> = (0..rows)
                .flat_map(|i| (0..tp).flat_map(move |k| (0..cols).map(move |j| (k, i, j))))
                .map(|(k, i, j)| tensor(k, rows, cols)[i * cols + j])
                .collect();
            assert_eq!(y, want, "gather_from_tp tp={tp}");
        }
        // ScatterToSp forward: rank r keeps rows [r*rows/tp, ...).
        for (rank, (y, _)) in apply(Mapping::ScatterToSp, false, tp, rows, cols)
            .into_iter()
            .enumerate()
        {
            let h = rows / tp;
            assert_eq!(
                y,
                full(rank)[rank * h * cols..(rank + 1) * h * cols].to_vec()
            );
        }
        // GatherFromSp forward: stack rows; backward: reduce-scatter rows.
        for (y, _) in apply(Mapping::GatherFromSp, false, tp, rows, cols) {
            let want: Vec<f32> = (0..tp).flat_map(|k| tensor(k, rows, cols)).collect();
            assert_eq!(y, want);
        }
        for (rank, (y, _)) in apply(Mapping::GatherFromSp, true, tp, rows, cols)
            .into_iter()
            .enumerate()
        {
            let h = rows / tp;
            assert_eq!(
                y,
                sum_over_ranks(tp, rows, cols)[rank * h * cols..(rank + 1) * h * cols].to_vec()
            );
        }
        // ReduceScatterToSp forward = GatherFromSp backward; its backward gathers.
        for (rank, (y, _)) in apply(Mapping::ReduceScatterToSp, false, tp, rows, cols)
            .into_iter()
            .enumerate()
        {
            let h = rows / tp;
            assert_eq!(
                y,
                sum_over_ranks(tp, rows, cols)[rank * h * cols..(rank + 1) * h * cols].to_vec()
            );
        }
    }
}

#[test]
fn pairs_are_duals_on_four_ranks() {
    let (rows, cols) = (8, 12);
    let tp = 4;
    // scatter_to_tp backward == gather_from_tp forward (same input shard shape).
    let a = apply(Mapping::ScatterToTp, true, tp, rows, cols / tp);
    let b = apply(Mapping::GatherFromTp, false, tp, rows, cols / tp);
    assert_eq!(a, b);
    // gather_from_tp backward == scatter_to_tp forward.
    assert_eq!(
        apply(Mapping::GatherFromTp, true, tp, rows, cols),
        apply(Mapping::ScatterToTp, false, tp, rows, cols)
    );
    // scatter_to_sp backward == gather_from_sp forward.
    assert_eq!(
        apply(Mapping::ScatterToSp, true, tp, rows / tp, cols),
        apply(Mapping::GatherFromSp, false, tp, rows / tp, cols)
    );
    // reduce_scatter_to_sp backward == gather_from_sp forward.
    assert_eq!(
        apply(Mapping::ReduceScatterToSp, true, tp, rows / tp, cols),
        apply(Mapping::GatherFromSp, false, tp, rows / tp, cols)
    );
}

#[test]
fn shapes_that_do_not_divide_are_errors() {
    run_ranks(2, |c| {
        let dev = c.device().clone();
        let x = dev.alloc_zeros::<f32>(15).unwrap();
        let mut y = dev.alloc_zeros::<f32>(15).unwrap();
        let e = Mapping::ScatterToTp
            .forward(&c, c.stream(), &x, &mut y, (3, 5))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`cols`") && e.contains("multiple of the tensor-parallel size 2"),
            "{e}"
        );
        let e = Mapping::ScatterToSp
            .forward(&c, c.stream(), &x, &mut y, (3, 5))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`rows`"), "{e}");
        let mut wrong = dev.alloc_zeros::<f32>(14).unwrap();
        let e = Mapping::CopyToTp
            .forward(&c, c.stream(), &x, &mut wrong, (3, 5))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`output`") && e.contains("exactly 3x5"), "{e}");
    });
}
