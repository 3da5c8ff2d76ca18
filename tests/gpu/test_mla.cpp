// MLA's core on the GPU: the ops of model/layers/mla.cpp around attention, run through the kernel table on
// both backends with the same inputs: the queries' RoPE on each head's last `rope` columns, the keys and
// zero-padded values assembled from wkv_b's output and the one shared rotary key (column slices, the key
// broadcast over H heads), attention at the padded width dq = nope + rope, the output cut back to v_dim; and
// the backward of each. MLA needs no CUDA entry of its own: this checks that the entries it uses compose as
// on the cpu at MLA's shapes (d = 48 as deepseek-tiny, v_dim < dq), and that the padding columns of the
// attention output are exactly zero.
// Legend: B batch, S sequence, N = B S tokens, H heads, nope / rope / v_dim head widths, dq = nope + rope.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test.h"

namespace meshtrain::gpu_test {
namespace {

struct MlaShape {
  int64_t B, S, H, nope, rope, v_dim;
  bool packed;  // packed documents (segment ids, positions restarting) or one sequence each
};

// Attention's tolerances of test_attention.cpp (relative to the tensor's largest magnitude, floor 1), with
// their reasoning: 1e-4 forward, 1e-3 for gradients that sum many terms of both signs.
constexpr double kForwardTolerance = 1e-4;
constexpr double kGradientTolerance = 1e-3;

void expect_close_scaled(const std::vector<float>& gpu, const std::vector<float>& cpu, double tolerance,
                         const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double largest = 1.0, worst = 0.0;
  for (const float value : cpu) largest = std::max(largest, static_cast<double>(std::abs(value)));
  size_t worst_at = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double error = std::abs(static_cast<double>(gpu[i]) - static_cast<double>(cpu[i]));
    if (!(error <= worst)) {
      worst = error;
      worst_at = i;
    }
  }
  EXPECT_LE(worst, tolerance * largest)
      << what << ": element " << worst_at << " gpu " << gpu[worst_at] << " cpu " << cpu[worst_at];
}

// The tensors of one MLA core, as pointers into one backend's memory.
struct MlaTensors {
  float *q, *kv_b, *k_rope;         // inputs: [N, H, dq], [N, H, nope + v_dim], [N, rope]
  float *q_rope, *k, *v, *o, *lse;  // [N, H, rope], [N, H, dq] x 3, [B, H, S]
  float* attended;                  // [N, H, v_dim]
  float *d_attended, *d_o, *d_q, *d_k, *d_v, *d_q_rope, *d_kv_b, *d_k_rope, *scratch;
  const int32_t *positions, *segment_ids;  // [B, S]; segment ids or nullptr
};

// mla.cpp's forward (q_rope_forward, the key's RoPE of split_kv_a, assemble_kv, attention, unpad_attended)
// and backward (unpad_attended_backward, attention, assemble_kv_backward, q_rope_backward, the key's RoPE
// backward), through `kb`.
void run_mla_core(const kernels::KernelBackend& kb, const MlaShape& s, const MlaTensors& t) {
  const int64_t N = s.B * s.S, H = s.H, nope = s.nope, rope = s.rope, v_dim = s.v_dim;
  const int64_t dq = nope + rope, kv_b_width = nope + v_dim;
  const float theta = 10000.0f;
  // Queries: RoPE on each head's last rope columns, in place through the q_rope scratch.
  kb.column_slice_forward(t.q_rope, t.q + nope, N * H, rope, 1, rope, dq);
  kb.rope_forward(t.q_rope, t.q_rope, t.positions, N, H, rope, theta);
  kb.column_slice_forward(t.q + nope, t.q_rope, N * H, rope, 1, dq, rope);
  kb.rope_forward(t.k_rope, t.k_rope, t.positions, N, 1, rope, theta);
  // Keys [k_nope | k_rope for every head], values [v | zeros].
  kb.column_slice_forward(t.k, t.kv_b, N * H, nope, 1, dq, kv_b_width);
  kb.column_slice_forward(t.k + nope, t.k_rope, N, rope, H, dq, rope);
  kb.column_slice_forward(t.v, t.kv_b + nope, N * H, v_dim, 1, dq, kv_b_width);
  if (dq > v_dim) kb.column_slice_forward(t.v + v_dim, nullptr, N * H, dq - v_dim, 1, dq, 0);
  kb.attention_forward(t.o, t.lse, t.q, t.k, t.v, t.positions, t.segment_ids, s.B, s.S, H, H, dq);
  kb.column_slice_forward(t.attended, t.o, N * H, v_dim, 1, v_dim, dq);

  kb.column_slice_forward(t.d_o, t.d_attended, N * H, v_dim, 1, dq, v_dim);
  if (dq > v_dim) kb.column_slice_forward(t.d_o + v_dim, nullptr, N * H, dq - v_dim, 1, dq, 0);
  kb.attention_backward(t.d_q, t.d_k, t.d_v, t.d_o, t.o, t.lse, t.q, t.k, t.v, t.positions, t.segment_ids,
                        s.B, s.S, H, H, dq, t.scratch);
  kb.column_slice_backward(t.d_kv_b, t.d_k, N * H, nope, 1, kv_b_width, dq);
  kb.column_slice_backward(t.d_kv_b + nope, t.d_v, N * H, v_dim, 1, kv_b_width, dq);
  kb.column_slice_backward(t.d_k_rope, t.d_k + nope, N, rope, H, rope, dq);
  kb.rope_backward(t.d_k_rope, t.d_k_rope, t.positions, N, 1, rope, theta);
  kb.column_slice_forward(t.d_q_rope, t.d_q + nope, N * H, rope, 1, rope, dq);
  kb.rope_backward(t.d_q_rope, t.d_q_rope, t.positions, N, H, rope, theta);
  kb.column_slice_forward(t.d_q + nope, t.d_q_rope, N * H, rope, 1, dq, rope);
}

void check_mla(const MlaShape& s, uint32_t seed) {
  const int64_t N = s.B * s.S, dq = s.nope + s.rope;
  SCOPED_TRACE("B=" + std::to_string(s.B) + " S=" + std::to_string(s.S) + " H=" + std::to_string(s.H) +
               " nope=" + std::to_string(s.nope) + " rope=" + std::to_string(s.rope) +
               " v_dim=" + std::to_string(s.v_dim) + (s.packed ? " packed" : ""));
  const auto heads = [&](int64_t width) { return static_cast<size_t>(N * s.H * width); };
  std::vector<int32_t> positions(static_cast<size_t>(N)), segments(static_cast<size_t>(N));
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t i = 0; i < s.S; ++i) {
      // Packed: documents of 11 tokens (positions restart, a segment id each).
      const int64_t document = s.packed ? i / 11 : 0;
      positions[static_cast<size_t>(b * s.S + i)] = static_cast<int32_t>(s.packed ? i % 11 : i);
      segments[static_cast<size_t>(b * s.S + i)] = static_cast<int32_t>(b * 100 + document);
    }
  }
  const std::vector<float> q = normal_values(heads(dq), seed, 2.0f);
  const std::vector<float> kv_b = normal_values(heads(s.nope + s.v_dim), seed + 1);
  const std::vector<float> k_rope = normal_values(static_cast<size_t>(N * s.rope), seed + 2);
  const std::vector<float> d_attended = normal_values(heads(s.v_dim), seed + 3);
  const auto lse_count = static_cast<size_t>(s.B * s.H * s.S);

  // Host and device copies of every tensor (MlaTensors' order), the outputs NaN-filled.
  const std::vector<size_t> sizes = {heads(dq),
                                     heads(s.nope + s.v_dim),
                                     static_cast<size_t>(N * s.rope),
                                     heads(s.rope),
                                     heads(dq),
                                     heads(dq),
                                     heads(dq),
                                     lse_count,
                                     heads(s.v_dim),
                                     heads(s.v_dim),
                                     heads(dq),
                                     heads(dq),
                                     heads(dq),
                                     heads(dq),
                                     heads(s.rope),
                                     heads(s.nope + s.v_dim),
                                     static_cast<size_t>(N * s.rope),
                                     lse_count};
  std::vector<std::vector<float>> host(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) host[i].assign(sizes[i], std::numeric_limits<float>::quiet_NaN());
  host[0] = q;
  host[1] = kv_b;
  host[2] = k_rope;
  host[9] = d_attended;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> device;
  for (const std::vector<float>& values : host)
    device.push_back(std::make_unique<DeviceBuffer<float>>(values));
  const DeviceBuffer<int32_t> positions_gpu(positions), segments_gpu(segments);
  const auto tensors = [&](auto pointer, const int32_t* position_ids, const int32_t* segment_ids) {
    return MlaTensors{pointer(0),  pointer(1),  pointer(2),  pointer(3),   pointer(4),
                      pointer(5),  pointer(6),  pointer(7),  pointer(8),   pointer(9),
                      pointer(10), pointer(11), pointer(12), pointer(13),  pointer(14),
                      pointer(15), pointer(16), pointer(17), position_ids, s.packed ? segment_ids : nullptr};
  };
  // d_kv_b and d_k_rope are written by column_slice_backward over all their columns: no prior values.
  run_mla_core(kernels::cpu_backend(), s,
               tensors([&](size_t i) { return host[i].data(); }, positions.data(), segments.data()));
  run_mla_core(cuda(), s,
               tensors([&](size_t i) { return device[i]->get(); }, positions_gpu.get(), segments_gpu.get()));
  const char* names[] = {"q after RoPE", "kv_b",     "k_rope after RoPE", "q_rope", "k",   "v",   "o",
                         "lse",          "attended", "d_attended",        "d_o",    "d_q", "d_k", "d_v",
                         "d_q_rope",     "d_kv_b",   "d_k_rope",          "scratch"};
  for (const size_t i : {size_t{0}, size_t{2}, size_t{4}, size_t{5}, size_t{6}, size_t{7}, size_t{8}}) {
    expect_close_scaled(device[i]->read(), host[i], kForwardTolerance, names[i]);
  }
  for (const size_t i : {size_t{11}, size_t{12}, size_t{13}, size_t{15}, size_t{16}}) {
    expect_close_scaled(device[i]->read(), host[i], kGradientTolerance, names[i]);
  }
  // The padding columns of o are zero exactly: a convex combination of zero value columns.
  const std::vector<float> o = device[6]->read();
  for (int64_t row = 0; row < N * s.H; ++row) {
    for (int64_t c = s.v_dim; c < dq; ++c) {
      ASSERT_EQ(o[static_cast<size_t>(row * dq + c)], 0.0f) << "o padding, row " << row << " column " << c;
    }
  }
}

// deepseek-custom-tiny's widths (H 6, nope 32, rope 16, v_dim 32: d = 48), and a narrower one with v_dim
// below nope in the smallest width bucket; plain and packed sequences of odd lengths.
TEST(CudaMla, CoreMatchesCpuThroughTheKernelTable) {
  MT_REQUIRE_GPU();
  check_mla({2, 37, 6, 32, 16, 32, false}, 7000);
  check_mla({2, 37, 6, 32, 16, 32, true}, 7010);
  check_mla({1, 70, 3, 24, 8, 16, true}, 7020);
}

}  // namespace
}  // namespace meshtrain::gpu_test
