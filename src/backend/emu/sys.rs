//! Raw bindings to the emulator runtime (`cuda/emu/emu_api.h`).

use core::ffi::{c_char, c_int, c_void};

#[repr(C)]
pub struct LaunchDesc {
    pub kernel_name: *const c_char,
    pub entry: Option<unsafe extern "C" fn(*const c_void)>,
    pub params: *const c_void,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_smem_bytes: usize,
    pub num_workers: u32,
    pub cluster_x: u32,
}

extern "C" {
    pub fn ftn_emu_launch(desc: *const LaunchDesc, err: *mut c_char, err_len: usize) -> c_int;
    pub fn ftn_emu_f32_to_f16_bits(x: f32) -> u16;
    pub fn ftn_emu_f16_bits_to_f32(h: u16) -> f32;
    pub fn ftn_emu_f32_to_bf16_bits(x: f32) -> u16;
    pub fn ftn_emu_bf16_bits_to_f32(b: u16) -> f32;
}

extern "C" {
    #[allow(clippy::too_many_arguments)]
    pub fn ftn_emu_tensor_map_encode_tiled(
        map: *mut crate::kernel_params::FtnTensorMap,
        dtype: c_int,
        rank: u32,
        global_address: *mut c_void,
        global_dim: *const u64,
        global_strides: *const u64,
        box_dim: *const u32,
        element_strides: *const u32,
        interleave: c_int,
        swizzle: c_int,
        l2_promotion: c_int,
        oob_fill: c_int,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}
