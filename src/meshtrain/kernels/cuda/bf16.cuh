// The one bf16 rounding of the cuda kernels (device code only): float32 to bfloat16 bits, nearest even, as
// the cpu kernels round (core/dtype.h, bfloat16_from_float), and the store of a producer's float32 result
// into a float32 or a bf16 output (the *_forward_bf16 entries: float32 math, one rounding on the store).
#pragma once

#include <cstdint>

namespace meshtrain::kernels::cuda {

// Nearest even, NaN kept a quiet NaN: the bits of bfloat16_from_float (core/dtype.h), computed the same way.
__device__ __forceinline__ uint16_t bf16_bits(float value) {
  const uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// out[i] = value, in the output's type: float32 as it is, bf16 rounded once.
__device__ __forceinline__ void store_output(float* out, int64_t i, float value) {
  out[i] = value;
}
__device__ __forceinline__ void store_output(uint16_t* out, int64_t i, float value) {
  out[i] = bf16_bits(value);
}

}  // namespace meshtrain::kernels::cuda
