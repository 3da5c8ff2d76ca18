#include "meshtrain/kernels/cpu/swiglu.h"

#include <cmath>

#include "meshtrain/kernels/cpu/fast_math.h"
#include "meshtrain/kernels/cpu/store.h"

namespace meshtrain::kernels {
namespace {

// Below this many values a parallel region costs more than it saves.
constexpr int64_t kParallelMinimum = 1 << 14;

// swiglu_forward into float32 or bfloat16 values (store.h).
template <class Out>
void swiglu_values(Out* out, const float* gate, const float* up, int64_t count) {
#pragma omp parallel for simd schedule(static) if (count >= kParallelMinimum)
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    // sigmoid_approx saturates: exactly 1 for g > 87, tiny and positive for g < -88 (no inf, no NaN).
    const float sigmoid = sigmoid_approx(g);
    store(out + i, g * sigmoid * up[i]);
  }
}

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, int64_t count) {
  swiglu_values(out, gate, up, count);
}

void swiglu_forward_bf16(uint16_t* out, const float* gate, const float* up, int64_t count) {
  swiglu_values(out, gate, up, count);
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     int64_t count) {
#pragma omp parallel for simd schedule(static) if (count >= kParallelMinimum)
  for (int64_t i = 0; i < count; ++i) {
    // All reads before the writes, so a gradient buffer may reuse an input's storage element for element.
    const float g = gate[i], u = up[i], d = dout[i];
    const float sigmoid = sigmoid_approx(g);
    dgate[i] = d * u * sigmoid * (1.0f + g * (1.0f - sigmoid));
    dup[i] = d * g * sigmoid;
  }
}

}  // namespace meshtrain::kernels
