// The CUDA norms (RMSNorm, LayerNorm), embedding and AdamW / sum-of-squares kernels against the cpu kernels
// of the same name on the same inputs: odd shapes, outputs pre-filled (NaN where the kernel must write,
// random values where it must add), parameter gradients accumulated onto pre-filled values, vocab-parallel
// ids outside this rank's rows, several AdamW steps. Every reduction the GPU runs is in a fixed order, so
// each backward is also run twice and must give bitwise the same result. Tolerances are on gpu_test.h's
// metric |gpu - cpu| / (1 + |cpu|), each justified where defined.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "meshtrain/kernels/cpu/adamw.h"
#include "meshtrain/kernels/cpu/embedding.h"
#include "meshtrain/kernels/cpu/layernorm.h"
#include "meshtrain/kernels/cpu/rmsnorm.h"

namespace meshtrain::gpu_test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Row-wise values (out, rstd, mean, dx): float sums over one row of D <= 1024 in different orders (the cpu's
// simd lanes, the GPU's 256-thread tree). With chains of at most D / 4 adds the typical relative error of a
// row sum is ~sqrt(D / 4) 2^-24 < 1e-6, carried into rstd (half of it) and into dx through small
// projection terms; 1e-5 leaves a factor >10. A wrong formula, row or column gives O(1e-1) or more.
constexpr double kRowTolerance = 1e-5;
// Parameter gradients (dw, db): float sums over N <= 300 rows of O(1) products in different orders (cpu:
// token order; GPU: 32 lanes, then the lanes in order); the sums are ~sqrt(N) = 17 and their typical
// error ~sqrt(N) 2^-24 |sum| ~ 2e-5 absolute, so ~1e-6 on the metric; 1e-4 allows the worst case of
// float summation over 300 terms (~N 2^-24 ~ 2e-5 relative) with margin. A missed or doubled row is O(1).
constexpr double kReductionTolerance = 1e-4;
// AdamW: the GPU runs the cpu kernel's operations in its order with correctly rounded float ops and no
// fused multiply-adds, so it equals the cpu's AVX-512 path bitwise; a cpu build whose compiler contracted
// the scalar loop differs by ~1 ulp in m, v and the parameter per step (the update itself is ~lr, far
// below the parameter): after 5 steps <= ~6e-7 on the metric. 2e-6 leaves a factor 3; a wrong bias
// correction, decay or moment formula gives >= 1e-4.
constexpr double kAdamwTolerance = 2e-6;
// Sum of squares in double: the host reference sums 10^6 positive terms in one chain (rigorous relative
// bound ~10^6 2^-53 = 1.1e-10, typical ~1e-13), the GPU in chains of <= 16 then fixed trees. 1e-9 relative
// is far below what float accumulation (~1e-7 to 1e-4) or one missing element (>= 1e-7 here) would give.
constexpr double kSumTolerance = 1e-9;

std::vector<float> plus(std::vector<float> values, float offset) {
  for (float& value : values) value += offset;
  return values;
}

std::string shape(int64_t N, int64_t D) {
  return "N=" + std::to_string(N) + " D=" + std::to_string(D);
}

size_t elements(int64_t count) {
  return static_cast<size_t>(count);
}

// ---- RMSNorm -------------------------------------------------------------------------------------------

// Forward (out and rstd pre-filled with NaN: every element must be written) and backward both ways of
// accumulate_dx (dx NaN when written, random when added onto), dw pre-filled (it accumulates); the
// backward of both sides takes the cpu's rstd, so it is compared on identical inputs.
void check_rmsnorm(int64_t N, int64_t D, uint32_t seed) {
  const std::string what = "rmsnorm " + shape(N, D);
  const float eps = 1e-6f;
  const std::vector<float> x = normal_values(elements(N * D), seed, 1.5f);
  const std::vector<float> w = plus(normal_values(elements(D), seed + 1, 0.3f), 1.0f);
  const std::vector<float> dout = normal_values(elements(N * D), seed + 2);

  std::vector<float> out_cpu(elements(N * D)), rstd_cpu(elements(N));
  kernels::rmsnorm_forward(out_cpu.data(), rstd_cpu.data(), x.data(), w.data(), N, D, eps);
  const DeviceBuffer<float> x_gpu(x), w_gpu(w), dout_gpu(dout), rstd_in(rstd_cpu);
  {
    const DeviceBuffer<float> out_gpu(std::vector<float>(elements(N * D), kNaN));
    const DeviceBuffer<float> rstd_gpu(std::vector<float>(elements(N), kNaN));
    cuda().rmsnorm_forward(out_gpu.get(), rstd_gpu.get(), x_gpu.get(), w_gpu.get(), N, D, eps);
    const std::vector<float> out = out_gpu.read(), rstd = rstd_gpu.read();
    expect_close(out, out_cpu, kRowTolerance, what + " forward out");
    expect_close(rstd, rstd_cpu, kRowTolerance, what + " forward rstd");

    // bf16 out (dtype=bfloat16, the matmuls' input): the float32 forward's values rounded once, bit for bit
    // (the same kernel code), rstd bitwise the float32 forward's; against the cpu's bf16 out, one bf16 ulp
    // plus the float32 tolerance (expect_bf16_close).
    const DeviceBuffer<float> rstd_bf16_gpu(std::vector<float>(elements(N), kNaN));
    const std::vector<uint16_t> out_bf16 = run_bf16_output(
        elements(N * D),
        [&](uint16_t* target) {
          cuda().rmsnorm_forward_bf16(target, rstd_bf16_gpu.get(), x_gpu.get(), w_gpu.get(), N, D, eps);
        },
        what + " forward_bf16");
    EXPECT_TRUE(out_bf16 == bf16_rounded(out)) << what << " forward_bf16: not the float32 out rounded once";
    expect_same_bits(rstd_bf16_gpu.read(), rstd, what + " forward_bf16 rstd");
    std::vector<uint16_t> out_cpu_bf16(elements(N * D));
    std::vector<float> rstd_cpu_bf16(elements(N));
    kernels::rmsnorm_forward_bf16(out_cpu_bf16.data(), rstd_cpu_bf16.data(), x.data(), w.data(), N, D, eps);
    expect_bf16_close(out_bf16, out_cpu_bf16, kRowTolerance, what + " forward_bf16 out vs cpu");
  }

  for (const bool accumulate : {false, true}) {
    const std::string case_what = what + (accumulate ? " backward (dx +=)" : " backward (dx =)");
    const std::vector<float> dx_start =
        accumulate ? normal_values(elements(N * D), seed + 3) : std::vector<float>(elements(N * D), kNaN);
    const std::vector<float> dw_start = normal_values(elements(D), seed + 4);
    std::vector<float> dx_cpu = dx_start, dw_cpu = dw_start;
    kernels::rmsnorm_backward(dx_cpu.data(), dw_cpu.data(), dout.data(), x.data(), w.data(), rstd_cpu.data(),
                              N, D, accumulate);
    std::vector<float> dx_runs[2], dw_runs[2];
    for (int run = 0; run < 2; ++run) {
      const DeviceBuffer<float> dx_gpu(dx_start), dw_gpu(dw_start);
      cuda().rmsnorm_backward(dx_gpu.get(), dw_gpu.get(), dout_gpu.get(), x_gpu.get(), w_gpu.get(),
                              rstd_in.get(), N, D, accumulate);
      dx_runs[run] = dx_gpu.read();
      dw_runs[run] = dw_gpu.read();
    }
    expect_close(dx_runs[0], dx_cpu, kRowTolerance, case_what + " dx");
    expect_close(dw_runs[0], dw_cpu, kReductionTolerance, case_what + " dw");
    expect_same_bits(dx_runs[1], dx_runs[0], case_what + " dx, second run");
    expect_same_bits(dw_runs[1], dw_runs[0], case_what + " dw, second run");
  }
}

TEST(CudaRmsnorm, OddShape) {
  MT_REQUIRE_GPU();
  check_rmsnorm(37, 53, 101);
}

TEST(CudaRmsnorm, WideRows) {
  MT_REQUIRE_GPU();
  check_rmsnorm(300, 1024, 202);
}

TEST(CudaRmsnorm, RowsNotFillingTheBlock) {
  MT_REQUIRE_GPU();
  check_rmsnorm(1, 33, 303);    // one row, one column past a warp
  check_rmsnorm(70, 257, 304);  // a row one column past the 256 threads
}

// ---- LayerNorm -----------------------------------------------------------------------------------------

// As check_rmsnorm, with x centred on 2 (the mean and the two-pass variance matter) and a bias.
void check_layernorm(int64_t N, int64_t D, uint32_t seed) {
  const std::string what = "layernorm " + shape(N, D);
  const float eps = 1e-5f;
  const std::vector<float> x = plus(normal_values(elements(N * D), seed, 1.5f), 2.0f);
  const std::vector<float> w = plus(normal_values(elements(D), seed + 1, 0.3f), 1.0f);
  const std::vector<float> b = normal_values(elements(D), seed + 2, 0.5f);
  const std::vector<float> dout = normal_values(elements(N * D), seed + 3);

  std::vector<float> out_cpu(elements(N * D)), mean_cpu(elements(N)), rstd_cpu(elements(N));
  kernels::layernorm_forward(out_cpu.data(), mean_cpu.data(), rstd_cpu.data(), x.data(), w.data(), b.data(),
                             N, D, eps);
  const DeviceBuffer<float> x_gpu(x), w_gpu(w), b_gpu(b), dout_gpu(dout), mean_in(mean_cpu),
      rstd_in(rstd_cpu);
  {
    const DeviceBuffer<float> out_gpu(std::vector<float>(elements(N * D), kNaN));
    const DeviceBuffer<float> mean_gpu(std::vector<float>(elements(N), kNaN));
    const DeviceBuffer<float> rstd_gpu(std::vector<float>(elements(N), kNaN));
    cuda().layernorm_forward(out_gpu.get(), mean_gpu.get(), rstd_gpu.get(), x_gpu.get(), w_gpu.get(),
                             b_gpu.get(), N, D, eps);
    const std::vector<float> out = out_gpu.read(), mean = mean_gpu.read(), rstd = rstd_gpu.read();
    expect_close(out, out_cpu, kRowTolerance, what + " forward out");
    expect_close(mean, mean_cpu, kRowTolerance, what + " forward mean");
    expect_close(rstd, rstd_cpu, kRowTolerance, what + " forward rstd");

    // bf16 out, as check_rmsnorm's: the float32 out rounded once, mean and rstd bitwise the float32
    // forward's.
    const DeviceBuffer<float> mean_bf16_gpu(std::vector<float>(elements(N), kNaN));
    const DeviceBuffer<float> rstd_bf16_gpu(std::vector<float>(elements(N), kNaN));
    const std::vector<uint16_t> out_bf16 = run_bf16_output(
        elements(N * D),
        [&](uint16_t* target) {
          cuda().layernorm_forward_bf16(target, mean_bf16_gpu.get(), rstd_bf16_gpu.get(), x_gpu.get(),
                                        w_gpu.get(), b_gpu.get(), N, D, eps);
        },
        what + " forward_bf16");
    EXPECT_TRUE(out_bf16 == bf16_rounded(out)) << what << " forward_bf16: not the float32 out rounded once";
    expect_same_bits(mean_bf16_gpu.read(), mean, what + " forward_bf16 mean");
    expect_same_bits(rstd_bf16_gpu.read(), rstd, what + " forward_bf16 rstd");
    std::vector<uint16_t> out_cpu_bf16(elements(N * D));
    std::vector<float> mean_cpu_bf16(elements(N)), rstd_cpu_bf16(elements(N));
    kernels::layernorm_forward_bf16(out_cpu_bf16.data(), mean_cpu_bf16.data(), rstd_cpu_bf16.data(), x.data(),
                                    w.data(), b.data(), N, D, eps);
    expect_bf16_close(out_bf16, out_cpu_bf16, kRowTolerance, what + " forward_bf16 out vs cpu");
  }

  for (const bool accumulate : {false, true}) {
    const std::string case_what = what + (accumulate ? " backward (dx +=)" : " backward (dx =)");
    const std::vector<float> dx_start =
        accumulate ? normal_values(elements(N * D), seed + 4) : std::vector<float>(elements(N * D), kNaN);
    const std::vector<float> dw_start = normal_values(elements(D), seed + 5);
    const std::vector<float> db_start = normal_values(elements(D), seed + 6);
    std::vector<float> dx_cpu = dx_start, dw_cpu = dw_start, db_cpu = db_start;
    kernels::layernorm_backward(dx_cpu.data(), dw_cpu.data(), db_cpu.data(), dout.data(), x.data(), w.data(),
                                mean_cpu.data(), rstd_cpu.data(), N, D, accumulate);
    std::vector<float> dx_runs[2], dw_runs[2], db_runs[2];
    for (int run = 0; run < 2; ++run) {
      const DeviceBuffer<float> dx_gpu(dx_start), dw_gpu(dw_start), db_gpu(db_start);
      cuda().layernorm_backward(dx_gpu.get(), dw_gpu.get(), db_gpu.get(), dout_gpu.get(), x_gpu.get(),
                                w_gpu.get(), mean_in.get(), rstd_in.get(), N, D, accumulate);
      dx_runs[run] = dx_gpu.read();
      dw_runs[run] = dw_gpu.read();
      db_runs[run] = db_gpu.read();
    }
    expect_close(dx_runs[0], dx_cpu, kRowTolerance, case_what + " dx");
    expect_close(dw_runs[0], dw_cpu, kReductionTolerance, case_what + " dw");
    expect_close(db_runs[0], db_cpu, kReductionTolerance, case_what + " db");
    expect_same_bits(dx_runs[1], dx_runs[0], case_what + " dx, second run");
    expect_same_bits(dw_runs[1], dw_runs[0], case_what + " dw, second run");
    expect_same_bits(db_runs[1], db_runs[0], case_what + " db, second run");
  }
}

TEST(CudaLayernorm, OddShape) {
  MT_REQUIRE_GPU();
  check_layernorm(37, 53, 401);
}

TEST(CudaLayernorm, WideRows) {
  MT_REQUIRE_GPU();
  check_layernorm(300, 1024, 502);
}

TEST(CudaLayernorm, GptWidth) {
  MT_REQUIRE_GPU();
  check_layernorm(129, 768, 603);
}

// ---- Embedding -----------------------------------------------------------------------------------------

// The ids of N tokens over global rows [0, G): uniform over `distinct` consecutive rows starting at
// `first` (few distinct rows: many repeats), then the edges of this rank's rows [offset, offset + R) and
// their neighbours outside it (where they exist) written over the first tokens, and token 1 repeating
// token 0.
std::vector<int32_t> token_ids(int64_t N, int64_t G, int64_t offset, int64_t R, int64_t first,
                               int64_t distinct, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_int_distribution<int64_t> pick(first, first + distinct - 1);
  std::vector<int32_t> ids(elements(N));
  for (int32_t& id : ids) id = static_cast<int32_t>(pick(generator));
  std::vector<int64_t> edges = {offset, offset + R - 1};
  if (offset > 0) edges.push_back(offset - 1);
  if (offset + R < G) edges.push_back(offset + R);
  edges.push_back(0);
  edges.push_back(G - 1);
  for (size_t k = 0; k < edges.size() && 2 + k < ids.size(); ++k) ids[2 + k] = static_cast<int32_t>(edges[k]);
  if (N > 1) ids[1] = ids[0];
  return ids;
}

struct EmbeddingCase {
  int64_t N, R, D, vocab_offset, global_rows;  // global_rows < 0: vocab_offset + R
  int64_t first, distinct;                     // the ids' range (see token_ids)
};

std::string describe(const EmbeddingCase& c) {
  return "embedding N=" + std::to_string(c.N) + " R=" + std::to_string(c.R) + " D=" + std::to_string(c.D) +
         " vocab_offset=" + std::to_string(c.vocab_offset) + " global_rows=" + std::to_string(c.global_rows);
}

// Forward (written: out pre-filled NaN, zero rows for ids held elsewhere; accumulate: out pre-filled,
// unchanged there) and backward (dtable pre-filled; scatter-add), both bitwise against the cpu: the lookup
// copies or adds one float, and the GPU's backward adds each table element's tokens in token order, the
// cpu's order.
void check_embedding(const EmbeddingCase& c, uint32_t seed) {
  const std::string what = describe(c);
  const int64_t G = c.global_rows < 0 ? c.vocab_offset + c.R : c.global_rows;
  const std::vector<int32_t> ids = token_ids(c.N, G, c.vocab_offset, c.R, c.first, c.distinct, seed);
  const std::vector<float> table = normal_values(elements(c.R * c.D), seed + 1);
  const std::vector<float> dout = normal_values(elements(c.N * c.D), seed + 2);
  const DeviceBuffer<int32_t> ids_gpu(ids);
  const DeviceBuffer<float> table_gpu(table), dout_gpu(dout);

  for (const bool accumulate : {false, true}) {
    const std::vector<float> out_start = accumulate ? normal_values(elements(c.N * c.D), seed + 3)
                                                    : std::vector<float>(elements(c.N * c.D), kNaN);
    std::vector<float> out_cpu = out_start;
    kernels::embedding_forward(out_cpu.data(), ids.data(), table.data(), c.N, c.R, c.D, accumulate,
                               c.vocab_offset, c.global_rows);
    const DeviceBuffer<float> out_gpu(out_start);
    cuda().embedding_forward(out_gpu.get(), ids_gpu.get(), table_gpu.get(), c.N, c.R, c.D, accumulate,
                             c.vocab_offset, c.global_rows);
    expect_same_bits(out_gpu.read(), out_cpu, what + (accumulate ? " forward (+=)" : " forward (=)"));
  }

  const std::vector<float> dtable_start = normal_values(elements(c.R * c.D), seed + 4);
  std::vector<float> dtable_cpu = dtable_start;
  kernels::embedding_backward(dtable_cpu.data(), ids.data(), dout.data(), c.N, c.R, c.D, c.vocab_offset,
                              c.global_rows);
  const DeviceBuffer<float> dtable_gpu(dtable_start);
  cuda().embedding_backward(dtable_gpu.get(), ids_gpu.get(), dout_gpu.get(), c.N, c.R, c.D, c.vocab_offset,
                            c.global_rows);
  expect_same_bits(dtable_gpu.read(), dtable_cpu, what + " backward");
}

TEST(CudaEmbedding, WholeTable) {
  MT_REQUIRE_GPU();
  check_embedding({37, 11, 53, 0, -1, 0, 11}, 701);
}

TEST(CudaEmbedding, VocabParallelRank) {
  MT_REQUIRE_GPU();
  // Rank 2 of 4, rows [58, 87) of 116: most ids are another rank's.
  check_embedding({300, 29, 1024, 58, 116, 0, 116}, 702);
  // Rank 0 of 4 (global_rows given, so ids >= R are other ranks', not errors).
  check_embedding({300, 29, 53, 0, 116, 0, 116}, 703);
  // Last rank.
  check_embedding({300, 29, 53, 87, 116, 0, 116}, 704);
}

TEST(CudaEmbedding, RepeatedIdsOverManyTiles) {
  MT_REQUIRE_GPU();
  // 5000 tokens (several 1024-id tiles) over 7 rows, all held: each row is added ~700 times.
  check_embedding({5000, 200, 130, 200, 800, 300, 7}, 705);
  // 16384 tokens over every row of a rank holding 1000 of 4000.
  check_embedding({16384, 1000, 64, 1000, 4000, 0, 4000}, 706);
}

// ---- AdamW and the sum of squares ----------------------------------------------------------------------

// Five steps (1, 2, 3, 4, then 1000: the bias corrections near and far from 1) from zero moments, a new raw
// gradient each step (scale 1/64, a few exact zeros so v = 0 meets eps), cpu and GPU each carrying their
// own state; param, m and v compared after every step.
void check_adamw(int64_t count, bool weight_decay, uint32_t seed) {
  const std::string what = "adamw count=" + std::to_string(count) +
                           (weight_decay ? " with weight decay" : " without weight decay");
  std::vector<float> param_cpu = normal_values(elements(count), seed);
  std::vector<float> m_cpu(elements(count), 0.0f), v_cpu(elements(count), 0.0f);
  const DeviceBuffer<float> param_gpu(param_cpu), m_gpu(m_cpu), v_gpu(v_cpu);
  const int64_t steps[] = {1, 2, 3, 4, 1000};
  for (size_t k = 0; k < std::size(steps); ++k) {
    std::vector<float> grad = normal_values(elements(count), seed + 1 + static_cast<uint32_t>(k), 50.0f);
    for (size_t i = 0; i < grad.size(); i += 17) grad[i] = 0.0f;
    const kernels::AdamWStep step{.learning_rate = 3e-3f,
                                  .beta1 = 0.9f,
                                  .beta2 = 0.95f,
                                  .epsilon = 1e-8f,
                                  .weight_decay = 0.1f,
                                  .step = steps[k],
                                  .gradient_scale = 1.0f / 64.0f};
    kernels::adamw_update(param_cpu.data(), grad.data(), m_cpu.data(), v_cpu.data(), count, step,
                          weight_decay);
    const DeviceBuffer<float> grad_gpu(grad);
    cuda().adamw_update(param_gpu.get(), grad_gpu.get(), m_gpu.get(), v_gpu.get(), count, step, weight_decay);
    const std::string step_what = what + " step " + std::to_string(steps[k]);
    expect_close(param_gpu.read(), param_cpu, kAdamwTolerance, step_what + " param");
    expect_close(m_gpu.read(), m_cpu, kAdamwTolerance, step_what + " m");
    expect_close(v_gpu.read(), v_cpu, kAdamwTolerance, step_what + " v");
    if (::testing::Test::HasFailure()) return;  // one step's report is enough
  }
}

TEST(CudaAdamw, WithWeightDecay) {
  MT_REQUIRE_GPU();
  check_adamw(37, true, 801);
  check_adamw(100003, true, 802);
}

TEST(CudaAdamw, WithoutWeightDecay) {
  MT_REQUIRE_GPU();
  check_adamw(37, false, 803);
  check_adamw(100003, false, 804);
}

// The GPU's sum against a double loop and the cpu kernel (relative kSumTolerance), and against itself
// (bitwise: a fixed grid and order).
void check_sum_of_squares(const std::vector<float>& values, const std::string& what) {
  double expected = 0.0;
  for (const float value : values) expected += static_cast<double>(value) * static_cast<double>(value);
  const int64_t count = static_cast<int64_t>(values.size());
  const double cpu = kernels::sum_of_squares(values.data(), count);
  const DeviceBuffer<float> values_gpu(values);
  const double gpu = cuda().sum_of_squares(values_gpu.get(), count);
  const double again = cuda().sum_of_squares(values_gpu.get(), count);
  EXPECT_LE(std::abs(gpu - expected), kSumTolerance * expected)
      << what << ": gpu " << gpu << " loop " << expected;
  EXPECT_LE(std::abs(gpu - cpu), kSumTolerance * expected) << what << ": gpu " << gpu << " cpu " << cpu;
  EXPECT_EQ(std::memcmp(&gpu, &again, sizeof(double)), 0) << what << ": " << gpu << " then " << again;
}

TEST(CudaAdamw, SumOfSquares) {
  MT_REQUIRE_GPU();
  for (const int64_t count : {int64_t{1}, int64_t{1000}, int64_t{1000003}}) {
    check_sum_of_squares(normal_values(elements(count), 901 + static_cast<uint32_t>(count)),
                         "sum_of_squares count=" + std::to_string(count));
  }
  // One element: the square of a float is exact in double.
  const std::vector<float> one = {3.0e-3f};
  const DeviceBuffer<float> one_gpu(one);
  EXPECT_EQ(cuda().sum_of_squares(one_gpu.get(), 1),
            static_cast<double>(one[0]) * static_cast<double>(one[0]));
  // Squares beyond float's range (1e50): accumulated in double, not float.
  check_sum_of_squares(normal_values(1000, 905, 1e25f), "sum_of_squares of values ~1e25");
  // Nothing to sum.
  EXPECT_EQ(cuda().sum_of_squares(one_gpu.get(), 0), 0.0);
}

}  // namespace
}  // namespace meshtrain::gpu_test
