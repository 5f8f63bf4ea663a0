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
}

extern "C" {
    pub fn ftn_emu_launch(desc: *const LaunchDesc, err: *mut c_char, err_len: usize) -> c_int;
    pub fn ftn_emu_f32_to_f16_bits(x: f32) -> u16;
    pub fn ftn_emu_f16_bits_to_f32(h: u16) -> f32;
    pub fn ftn_emu_f32_to_bf16_bits(x: f32) -> u16;
    pub fn ftn_emu_bf16_bits_to_f32(b: u16) -> f32;
}
