// Rotary position embedding on the GPU (rope.h; semantics and the rotate-half pairing of kernels/cpu/rope.h).
// Legend: N tokens, H heads, d head width (even), half = d / 2 pairs per head; pair i of a head rotates
// elements i and i + half together by a = positions[n] * theta^(-2i/d), the angle formed in double.
#include <algorithm>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/rope.h"

namespace meshtrain::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// Blocks of one launch (each walks tokens with a grid stride): enough to fill every SM several times over.
constexpr int64_t kMaxBlocks = int64_t{1} << 14;

// One block per token at a time (grid-stride over tokens); threadIdx.x walks the pairs i, threadIdx.y the
// heads. Each thread forms cos/sin of its pair once per token (pow and sincos in double, rounded to float as
// the cpu kernel rounds them) and applies them to every head it walks. sign = +1 rotates by a (forward),
// -1 by -a (the transpose: backward). A thread reads both elements of a pair before writing either, and no
// other thread touches them, so out may alias x.
__global__ void rotate_kernel(float* out,                // [N, H, d]
                              const float* x,            // [N, H, d]
                              const int32_t* positions,  // [N]
                              int64_t N, int64_t H, int64_t d, double theta, float sign) {
  const int64_t half = d / 2;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const double position = static_cast<double>(positions[n]);
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      // As rope_angle in kernels/cpu/rope.h: position * theta^(-2i/d), in double.
      const double angle = position * pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      double sine = 0.0, cosine = 0.0;
      sincos(angle, &sine, &cosine);
      const float c = static_cast<float>(cosine), s = sign * static_cast<float>(sine);
      for (int64_t h = threadIdx.y; h < H; h += blockDim.y) {
        const int64_t base = (n * H + h) * d + i;
        const float first = x[base], second = x[base + half];
        out[base] = first * c - second * s;
        out[base + half] = second * c + first * s;
      }
    }
  }
}

void rotate(float* out, const float* x, const int32_t* positions, int64_t N, int64_t H, int64_t d,
            float theta, float sign) {
  MT_CHECK(d % 2 == 0, "rope head width " + to_text(d) + " is odd");
  const int64_t half = d / 2;
  if (N <= 0 || H <= 0 || half <= 0) return;
  // Pairs across x (all of them up to kThreads), heads across y with what remains of the block.
  const int64_t pairs = std::min<int64_t>(half, kThreads);
  const int64_t heads = std::min<int64_t>(H, kThreads / pairs);
  const dim3 block(static_cast<unsigned>(pairs), static_cast<unsigned>(heads));
  const dim3 grid(static_cast<unsigned>(std::min(N, kMaxBlocks)));
  rotate_kernel<<<grid, block, 0, stream()>>>(out, x, positions, N, H, d, static_cast<double>(theta), sign);
  MT_CUDA_LAUNCHED("rope rotate_kernel");
}

}  // namespace

void rope_forward(float* out, const float* x, const int32_t* positions, int64_t N, int64_t H, int64_t d,
                  float theta) {
  rotate(out, x, positions, N, H, d, theta, 1.0f);
}

void rope_backward(float* dx, const float* dout, const int32_t* positions, int64_t N, int64_t H, int64_t d,
                   float theta) {
  rotate(dx, dout, positions, N, H, d, theta, -1.0f);
}

}  // namespace meshtrain::kernels::cuda
