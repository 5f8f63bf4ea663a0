//! Stage layouts (`core::pipeline::layout`): explicit assignments — a valid
//! uneven one, and each broken rule as its named error (dropped,
//! duplicated, unknown, out-of-order and non-contiguous layers, an empty
//! stage, the wrong stage count, repeated layer names) — and Megatron's
//! even split: plain, with the embedding and/or the loss accounted for,
//! with given layer counts on the first/last rank, with vp = 2, and its
//! refusals (indivisible counts, an empty stage, conflicting options).

use ferrotron::core::pipeline::{transformer_layers, EvenSplit, StageLayout};
use ferrotron::Error;

fn model(decoders: usize) -> Vec<String> {
    transformer_layers(decoders)
}

fn stages(spec: &[&[&str]]) -> Vec<Vec<String>> {
    spec.iter()
        .map(|s| s.iter().map(|l| l.to_string()).collect())
        .collect()
}

/// The error's argument and its `got` text.
fn invalid(r: Result<StageLayout, Error>) -> (String, String) {
    match r {
        Err(Error::InvalidArgument { op, arg, got, .. }) => {
            assert_eq!(op, "pipeline stage layout");
            (arg.to_string(), got)
        }
        other => panic!("expected an InvalidArgument, got {other:?}"),
    }
}

#[test]
fn valid_uneven_assignment() {
    let l = StageLayout::from_assignment(
        &model(4),
        &stages(&[
            &["embedding"],
            &["decoder 0", "decoder 1", "decoder 2"],
            &["decoder 3", "loss"],
        ]),
        3,
    )
    .unwrap();
    assert_eq!(l.stages(), 3);
    assert_eq!(l.counts(), vec![1, 3, 2]);
    assert_eq!(l.stage_layers(1), ["decoder 0", "decoder 1", "decoder 2"]);
    assert_eq!(l.stage_of("decoder 3"), Some(2));
    assert_eq!(l.stage_of("embedding"), Some(0));
    assert_eq!(l.stage_of("nope"), None);
    assert_eq!(l.range(7), 0..0);
}

#[test]
fn dropped_layer() {
    let (arg, got) = invalid(StageLayout::from_assignment(
        &model(3),
        &stages(&[&["embedding", "decoder 0"], &["decoder 2", "loss"]]),
        2,
    ));
    assert_eq!(arg, "assignment");
    assert!(got.contains("`decoder 1` dropped"), "{got}");
}

#[test]
fn duplicated_layer() {
    let (arg, got) = invalid(StageLayout::from_assignment(
        &model(2),
        &stages(&[
            &["embedding", "decoder 0"],
            &["decoder 0", "decoder 1", "loss"],
        ]),
        2,
    ));
    assert_eq!(arg, "assignment");
    assert!(
        got.contains("`decoder 0` duplicated (stage 0 and stage 1)"),
        "{got}"
    );
}

#[test]
fn unknown_layer() {
    let (arg, got) = invalid(StageLayout::from_assignment(
        &model(1),
        &stages(&[&["embedding", "decoder 0"], &["decoder 1", "loss"]]),
        2,
    ));
    assert_eq!(arg, "assignment");
    assert!(
        got.contains("unknown layer `decoder 1` in stage 1"),
        "{got}"
    );
}

#[test]
fn out_of_order_layers() {
    // Swapped within a stage.
    let (arg, got) = invalid(StageLayout::from_assignment(
        &model(2),
        &stages(&[&["embedding", "decoder 1"], &["decoder 0", "loss"]]),
        2,
    ));
    assert_eq!(arg, "assignment");
    assert!(
        got.contains("`decoder 1` (stage 0) follows `embedding` (stage 0)"),
        "{got}"
    );
    // Not contiguous: stage 0 takes decoder 0 and decoder 2.
    let (_, got) = invalid(StageLayout::from_assignment(
        &model(3),
        &stages(&[
            &["embedding", "decoder 0", "decoder 2"],
            &["decoder 1", "loss"],
        ]),
        2,
    ));
    assert!(
        got.contains("`decoder 2` (stage 0) follows `decoder 0`"),
        "{got}"
    );
    // Stages in reverse.
    let (_, got) = invalid(StageLayout::from_assignment(
        &model(1),
        &stages(&[&["decoder 0", "loss"], &["embedding"]]),
        2,
    ));
    assert!(
        got.contains("`decoder 0` (stage 0) comes first instead of `embedding`"),
        "{got}"
    );
}

#[test]
fn wrong_stage_count_and_empty_stage() {
    let (arg, got) = invalid(StageLayout::from_assignment(
        &model(2),
        &stages(&[&["embedding", "decoder 0"], &["decoder 1", "loss"]]),
        4,
    ));
    assert_eq!(arg, "assignment");
    assert_eq!(got, "2 stages");
    let (arg, got) = invalid(StageLayout::from_assignment(
        &model(2),
        &stages(&[&["embedding", "decoder 0", "decoder 1"], &[], &["loss"]]),
        3,
    ));
    assert_eq!(arg, "assignment");
    assert!(got.contains("stage 1 is empty"), "{got}");
}

#[test]
fn repeated_layer_names_and_empty_model() {
    let (arg, got) = invalid(StageLayout::from_assignment(
        &["a", "b", "a"],
        &stages(&[&["a", "b"]]),
        1,
    ));
    assert_eq!(arg, "layers");
    assert!(got.contains("`a` at positions 0 and 2"), "{got}");
    let none: [&str; 0] = [];
    let (arg, _) = invalid(StageLayout::from_assignment(&none, &stages(&[&["a"]]), 1));
    assert_eq!(arg, "layers");
}

#[test]
fn even_split_plain() {
    // 8 decoder layers over pp 4: 2 each; embedding on stage 0, loss on 3.
    let l = StageLayout::even(&EvenSplit::new(8, 4, 1)).unwrap();
    assert_eq!(l.counts(), vec![3, 2, 2, 3]);
    assert_eq!(l.stage_layers(0), ["embedding", "decoder 0", "decoder 1"]);
    assert_eq!(l.stage_layers(3), ["decoder 6", "decoder 7", "loss"]);
    // Every split is also a valid explicit assignment of the same layers.
    let re = StageLayout::from_assignment(
        l.layers(),
        &(0..l.stages())
            .map(|s| l.stage_layers(s).to_vec())
            .collect::<Vec<_>>(),
        4,
    )
    .unwrap();
    assert_eq!(re, l);
}

#[test]
fn even_split_accounting_for_embedding_and_loss() {
    // 6 decoder layers + embedding + loss = 8 units over pp 4.
    let l = StageLayout::even(&EvenSplit {
        account_for_embedding: true,
        account_for_loss: true,
        ..EvenSplit::new(6, 4, 1)
    })
    .unwrap();
    assert_eq!(l.stage_layers(0), ["embedding", "decoder 0"]);
    assert_eq!(l.stage_layers(1), ["decoder 1", "decoder 2"]);
    assert_eq!(l.stage_layers(2), ["decoder 3", "decoder 4"]);
    assert_eq!(l.stage_layers(3), ["decoder 5", "loss"]);
    // Embedding only: 7 + 1 over 4.
    let l = StageLayout::even(&EvenSplit {
        account_for_embedding: true,
        ..EvenSplit::new(7, 4, 1)
    })
    .unwrap();
    assert_eq!(l.counts(), vec![2, 2, 2, 3]);
    // 6 + 1 = 7 units are not divisible by 4.
    let (arg, got) = invalid(StageLayout::even(&EvenSplit {
        account_for_embedding: true,
        ..EvenSplit::new(6, 4, 1)
    }));
    assert_eq!(arg, "decoder_layers");
    assert!(got.contains("7 in all"), "{got}");
}

#[test]
fn even_split_with_first_and_last_rank_layers() {
    // 10 decoder layers, pp 4: first rank 1, last rank 3, the middle 3 each.
    let l = StageLayout::even(&EvenSplit {
        first_rank_layers: Some(1),
        last_rank_layers: Some(3),
        ..EvenSplit::new(10, 4, 1)
    })
    .unwrap();
    assert_eq!(l.counts(), vec![2, 3, 3, 4]);
    assert_eq!(l.stage_layers(0), ["embedding", "decoder 0"]);
    assert_eq!(
        l.stage_layers(3),
        ["decoder 7", "decoder 8", "decoder 9", "loss"]
    );
    // The rest (10 − 1 = 9) over 3 other ranks.
    let l = StageLayout::even(&EvenSplit {
        first_rank_layers: Some(1),
        ..EvenSplit::new(10, 4, 1)
    })
    .unwrap();
    assert_eq!(l.counts(), vec![2, 3, 3, 4]);
    // 10 − 2 = 8 over 3 ranks.
    let (arg, _) = invalid(StageLayout::even(&EvenSplit {
        first_rank_layers: Some(2),
        ..EvenSplit::new(10, 4, 1)
    }));
    assert_eq!(arg, "decoder_layers");
    let (arg, _) = invalid(StageLayout::even(&EvenSplit {
        first_rank_layers: Some(8),
        last_rank_layers: Some(8),
        ..EvenSplit::new(10, 4, 1)
    }));
    assert_eq!(arg, "first_rank_layers + last_rank_layers");
    let (arg, _) = invalid(StageLayout::even(&EvenSplit {
        first_rank_layers: Some(1),
        account_for_embedding: true,
        ..EvenSplit::new(10, 4, 1)
    }));
    assert_eq!(arg, "first_rank_layers / last_rank_layers");
    let (arg, _) = invalid(StageLayout::even(&EvenSplit {
        last_rank_layers: Some(1),
        ..EvenSplit::new(1, 1, 1)
    }));
    assert_eq!(arg, "pp");
}

#[test]
fn even_split_interleaved() {
    // 8 decoder layers, pp 2, vp 2: 4 per rank, 2 per chunk; stage s is
    // rank s % 2, chunk s / 2.
    let l = StageLayout::even(&EvenSplit::new(8, 2, 2)).unwrap();
    assert_eq!(l.stages(), 4);
    assert_eq!(l.counts(), vec![3, 2, 2, 3]);
    assert_eq!(l.stage_layers(2), ["decoder 4", "decoder 5"]);
    // First rank 2 layers (1 per chunk), last rank 6 (3 per chunk).
    let l = StageLayout::even(&EvenSplit {
        first_rank_layers: Some(2),
        last_rank_layers: Some(6),
        ..EvenSplit::new(8, 2, 2)
    })
    .unwrap();
    assert_eq!(l.counts(), vec![2, 3, 1, 4]);
    // A rank's 3 layers do not split over 2 chunks.
    let (arg, got) = invalid(StageLayout::even(&EvenSplit::new(6, 2, 2)));
    assert_eq!(arg, "decoder_layers");
    assert!(got.contains("3 on rank 0"), "{got}");
}

#[test]
fn even_split_refusals() {
    // A middle stage would be empty: 0 decoder layers over pp 3.
    let (arg, got) = invalid(StageLayout::even(&EvenSplit::new(0, 3, 1)));
    assert_eq!(arg, "decoder_layers");
    assert!(got.contains("stage 1 would be empty"), "{got}");
    let (arg, _) = invalid(StageLayout::even(&EvenSplit::new(4, 0, 1)));
    assert_eq!(arg, "pp");
    let (arg, _) = invalid(StageLayout::even(&EvenSplit::new(4, 2, 0)));
    assert_eq!(arg, "vp");
    // Accounting for both with 0 decoder layers at pp 2: 2 units, 1 each;
    // stage 0 is the embedding alone, stage 1 the loss alone.
    let l = StageLayout::even(&EvenSplit {
        account_for_embedding: true,
        account_for_loss: true,
        ..EvenSplit::new(0, 2, 1)
    })
    .unwrap();
    assert_eq!(l.stage_layers(0), ["embedding"]);
    assert_eq!(l.stage_layers(1), ["loss"]);
}
