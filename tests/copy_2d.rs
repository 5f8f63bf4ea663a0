//! Strided 2-D copies (`ops::copy::copy_2d`) against a host loop: every
//! destination element, inside and outside the block, for each element
//! size and for aligned (128-bit) and unaligned offsets; and the argument
//! checks, including a single row with an enormous pitch (found by fuzzing
//! the C ABI: its byte pitch used to overflow).

use ferrotron::ops::copy::{copy_2d, Block2d};
use ferrotron::{Device, Element};

fn check<T: Element + PartialEq + std::fmt::Debug>(make: fn(usize) -> T) {
    let dev = Device::emu();
    let s = dev.new_stream().unwrap();
    for &(rows, cols, so, sp, d_o, dp) in &[
        (3usize, 5usize, 2usize, 7usize, 1usize, 9usize),
        (4, 8, 0, 8, 0, 16),
        (4, 16, 16, 32, 32, 48),
        (1, 3, 4, 3, 0, 3),
    ] {
        let src_len = so + (rows - 1) * sp + cols;
        let dst_len = d_o + (rows - 1) * dp + cols + 3;
        let src_h: Vec<T> = (0..src_len).map(make).collect();
        let fill = make(999_999);
        let src = dev.upload(&src_h).unwrap();
        let mut dst = dev.upload(&vec![fill; dst_len]).unwrap();
        let sa = Block2d {
            offset: so,
            pitch: sp,
        };
        let da = Block2d {
            offset: d_o,
            pitch: dp,
        };
        copy_2d(&s, &src, sa, &mut dst, da, rows, cols).unwrap();
        s.synchronize().unwrap();
        let mut want = vec![fill; dst_len];
        for i in 0..rows {
            for j in 0..cols {
                want[d_o + i * dp + j] = src_h[so + i * sp + j];
            }
        }
        assert_eq!(
            dst.to_host().unwrap(),
            want,
            "{rows}x{cols} {sa:?} -> {da:?}"
        );
    }
}

#[test]
fn copies_match_a_host_loop_for_every_element_size() {
    check::<u8>(|i| (i % 251) as u8);
    check::<half::bf16>(|i| half::bf16::from_f32(i as f32));
    check::<f32>(|i| i as f32);
    check::<i64>(|i| i as i64 * 1_000_003);
}

#[test]
fn a_single_row_ignores_its_pitch() {
    let dev = Device::emu();
    let s = dev.new_stream().unwrap();
    let src = dev.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    let mut dst = dev.alloc_zeros::<f32>(3).unwrap();
    let huge = Block2d {
        offset: 0,
        pitch: usize::MAX / 2,
    };
    copy_2d(&s, &src, huge, &mut dst, huge, 1, 3).unwrap();
    s.synchronize().unwrap();
    assert_eq!(dst.to_host().unwrap(), vec![1.0, 2.0, 3.0]);
}

#[test]
fn bad_blocks_are_errors() {
    let dev = Device::emu();
    let s = dev.new_stream().unwrap();
    let src = dev.alloc_zeros::<f32>(16).unwrap();
    let mut dst = dev.alloc_zeros::<f32>(16).unwrap();
    let ok = Block2d {
        offset: 0,
        pitch: 4,
    };
    let e = copy_2d(
        &s,
        &src,
        Block2d {
            offset: 0,
            pitch: 3,
        },
        &mut dst,
        ok,
        2,
        4,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`src_block.pitch`") && e.contains("pitch >= cols"),
        "{e}"
    );
    let e = copy_2d(
        &s,
        &src,
        ok,
        &mut dst,
        Block2d {
            offset: 9,
            pitch: 4,
        },
        2,
        4,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("`dst`") && e.contains("at least 17"), "{e}");
    let e = copy_2d(
        &s,
        &src,
        Block2d {
            offset: 0,
            pitch: usize::MAX / 2,
        },
        &mut dst,
        ok,
        3,
        4,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("`src`"), "{e}");
}
