// Rotary position embedding (rotate-half form) on query/key heads, with one position per token so packed or
// permuted sequences work. Legend: N tokens, H heads (query or kv), d head width (even).
#pragma once

#include <cmath>
#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// For i < d/2, a = positions[n] * theta^(-2i/d):
//   out[i] = x[i] cos a - x[i + d/2] sin a,   out[i + d/2] = x[i + d/2] cos a + x[i] sin a.
// Angles are computed in double (only cos/sin are rounded to float) so large positions stay accurate; the
// fast kernels take theta^(-2i/d) once per call and evaluate cos/sin with a vectorised double polynomial. out
// may alias x. d must be even.
RopeForward rope_forward;

// dx = rotation of dout by -a (the transpose of the forward rotation). dx may alias dout.
RopeBackward rope_backward;

// Frequency of pair i, theta^(-2i/d), in double. The fast kernels compute it once per call and pair.
inline double rope_inverse_frequency(int64_t i, int64_t d, double theta) {
  return std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
}

// Angle of pair i at a position, in double whatever T is (the fast kernels form the same product).
inline double rope_angle(int32_t position, int64_t i, int64_t d, double theta) {
  return static_cast<double>(position) * rope_inverse_frequency(i, d, theta);
}

// The references rotate as the fast kernels do: by a (sign +1: the forward) or by -a (sign -1: the
// transpose, the backward).
template <class T>
void rope_reference_rotate(T* out, const T* x, const int32_t* positions, int64_t N, int64_t H, int64_t d,
                           T theta, T sign) {
  const int64_t half = d / 2;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < H; ++h) {
      const T* source = x + (n * H + h) * d;
      T* target = out + (n * H + h) * d;
      for (int64_t i = 0; i < half; ++i) {
        const double angle = rope_angle(positions[n], i, d, static_cast<double>(theta));
        const T c = static_cast<T>(std::cos(angle)), s = sign * static_cast<T>(std::sin(angle));
        const T first = source[i], second = source[i + half];
        target[i] = first * c - second * s;
        target[i + half] = second * c + first * s;
      }
    }
  }
}

template <class T>
void rope_reference_forward(T* out, const T* x, const int32_t* positions, int64_t N, int64_t H, int64_t d,
                            T theta) {
  rope_reference_rotate(out, x, positions, N, H, d, theta, T(1));
}

template <class T>
void rope_reference_backward(T* dx, const T* dout, const int32_t* positions, int64_t N, int64_t H, int64_t d,
                             T theta) {
  rope_reference_rotate(dx, dout, positions, N, H, d, theta, T(-1));
}

}  // namespace meshtrain::kernels
