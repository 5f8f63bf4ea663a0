//! The Rust API refuses what the C ABI refuses, with the same named error
//! (issue 17, item 3): one row per check the C ABI relies on the Rust layer
//! for, each asserting the op and the argument the error names. The C side
//! of each row is in `ffi/tests/c/*.c` and the adversarial suite.

use std::time::Duration;

use ferrotron::comm::Communicator;
use ferrotron::core::loss_scaler::{DynamicGradScaler, GradScalerConfig};
use ferrotron::core::pipeline::{PipelineConfig, ScheduleKind};
use ferrotron::core::rank_grid::{RankGrid, RankOrder};
use ferrotron::ops::copy::{copy_2d, Block2d};
use ferrotron::ops::gemm::{Aux, Gemm, GemmInputs};
use ferrotron::ops::layernorm::LayerNorm;
use ferrotron::parallel::mappings::Mapping;
use ferrotron::{Device, DeviceBuffer, Error, Result};
use half::bf16;

type Row = (&'static str, &'static str, &'static str, fn() -> Result<()>);

/// (what, op in the message, argument named, the call).
const ROWS: &[Row] = &[
    ("scatter of 7 columns over tp 2", "", "cols", || {
        Mapping::ScatterToTp.forward_shape(4, 7, 2).map(drop)
    }),
    ("sequence scatter of 5 rows over tp 2", "", "rows", || {
        Mapping::ScatterToSp.forward_shape(5, 4, 2).map(drop)
    }),
    ("gather backward of 7 columns over tp 2", "", "cols", || {
        Mapping::GatherFromTp.backward_shape(4, 7, 2).map(drop)
    }),
    (
        "grid whose model size does not divide the world",
        "RankGrid::new",
        "",
        || RankGrid::new(4, 3, 1, 1, RankOrder::TpCpEpDpPp).map(drop),
    ),
    ("grid of world 0", "RankGrid::new", "world", || {
        RankGrid::new(0, 1, 1, 1, RankOrder::TpCpEpDpPp).map(drop)
    }),
    (
        "in-process communicator without devices",
        "Communicator::in_process",
        "devices",
        || Communicator::in_process(&[]).map(drop),
    ),
    (
        "in-process communicator with a zero timeout",
        "",
        "timeout",
        || Communicator::in_process_with_timeout(&[Device::emu()], Duration::ZERO).map(drop),
    ),
    ("send to this rank", "", "send peer", || {
        let c = Communicator::in_process(&[Device::emu()])?.remove(0);
        let s = c.device().new_stream()?;
        let b = c.device().alloc_zeros::<f32>(4)?;
        c.send(&s, &b, 0).map(drop)
    }),
    ("loss scaler state with a NaN scale", "", "scale", || {
        DynamicGradScaler::from_state(GradScalerConfig::default(), f32::NAN, 0, 1).map(drop)
    }),
    (
        "loss scaler state above the hysteresis",
        "",
        "hysteresis_tracker",
        || {
            let c = GradScalerConfig::default();
            DynamicGradScaler::from_state(c, 1.0, 0, c.hysteresis as i32 + 1).map(drop)
        },
    ),
    ("pipeline of 0 micro-batches", "", "microbatches", || {
        PipelineConfig {
            pp: 2,
            microbatches: 0,
            kind: ScheduleKind::OneFOneB,
        }
        .validate()
    }),
    ("copy_2d of overlapping blocks", "copy_2d", "dst", || {
        let dev = Device::emu();
        let s = dev.new_stream()?;
        let src = dev.alloc_zeros::<f32>(16)?;
        // SAFETY: a view of `src`'s own memory, used for this call only.
        let mut dst = unsafe { DeviceBuffer::<f32>::from_raw_parts(&dev, src.addr(), 16) }?;
        let at = |offset| Block2d { offset, pitch: 4 };
        copy_2d(&s, &src, at(0), &mut dst, at(2), 2, 4)
    }),
    (
        "copy_2d with a pitch below cols",
        "copy_2d",
        "src_block.pitch",
        || {
            let dev = Device::emu();
            let s = dev.new_stream()?;
            let src = dev.alloc_zeros::<f32>(16)?;
            let mut dst = dev.alloc_zeros::<f32>(16)?;
            let at = |pitch| Block2d { offset: 0, pitch };
            copy_2d(&s, &src, at(3), &mut dst, at(4), 2, 4)
        },
    ),
    ("LayerNorm forward in place", "", "y", || {
        let dev = Device::emu();
        let s = dev.new_stream()?;
        let x = dev.alloc_zeros::<f32>(8)?;
        // SAFETY: a view of `x`'s own memory, used for this call only.
        let mut y = unsafe { DeviceBuffer::<f32>::from_raw_parts(&dev, x.addr(), 8) }?;
        let (mut mean, mut rstd) = (dev.alloc_zeros::<f32>(2)?, dev.alloc_zeros::<f32>(2)?);
        LayerNorm::new(2, 4).forward(&s, &x, None, None, &mut y, &mut mean, &mut rstd)
    }),
    ("GEMM with lda below the row length", "gemm", "lda", || {
        let dev = Device::emu();
        let s = dev.new_stream()?;
        let a = dev.alloc_zeros::<bf16>(64)?;
        let mut d = dev.alloc_zeros::<f32>(64)?;
        let inputs = GemmInputs {
            a: &a,
            b: &a,
            bias: None,
            c: None,
        };
        Gemm::new(8, 8, 8)
            .lds(Some(7), None, None, None, None)
            .run(&s, inputs, Aux::None, &mut d)
    }),
];

#[test]
fn the_rust_api_names_what_the_c_abi_names() {
    let mut bad = Vec::new();
    for (what, op, arg, call) in ROWS {
        match call() {
            Err(Error::InvalidArgument { op: o, arg: a, .. })
                if (op.is_empty() || o == *op) && (arg.is_empty() || a == *arg) => {}
            other => bad.push(format!(
                "{what}: want InvalidArgument of `{op}` naming `{arg}`, got {other:?}"
            )),
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
