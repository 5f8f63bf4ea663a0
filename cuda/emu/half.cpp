// The exported bit-exact f16/bf16 scalar conversions of emu_api.h; they are
// the same inline functions the kernels' __half/__nv_bfloat16 types use.
#include "cuda_emu.h"

extern "C" uint16_t ftn_emu_f32_to_f16_bits(float x) { return ftn_emu::f32_to_f16(x); }
extern "C" float ftn_emu_f16_bits_to_f32(uint16_t h) { return ftn_emu::f16_to_f32(h); }
extern "C" uint16_t ftn_emu_f32_to_bf16_bits(float x) { return ftn_emu::f32_to_bf16(x); }
extern "C" float ftn_emu_bf16_bits_to_f32(uint16_t b) { return ftn_emu::bf16_to_f32(b); }
