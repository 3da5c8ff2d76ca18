// Argument and result types of the kernel ops that every backend shares (the kernels' signatures in
// signatures.h, the backend table in backend.h, and the model ops that call through it), so that a caller
// needs no backend's header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

namespace meshtrain::kernels {

// One AdamW step's hyperparameters (adamw_update).
struct AdamWStep {
  float learning_rate, beta1, beta2, epsilon, weight_decay;
  int64_t step;          // 1-based, for bias correction
  float gradient_scale;  // multiplies the raw gradient first: 1/global_valid_tokens x clip factor
  // Nesterov's first moment (optax's adamw(nesterov=True), which optax.contrib.muon steps the parameters
  // Muon does not with): mhat = b1 m / (1 - b1^(t+1)) + (1 - b1) g / (1 - b1^t).
  bool nesterov = false;
};

// One Muon step's hyperparameters (muon_update; optax.contrib.muon).
struct MuonStep {
  float learning_rate, beta, epsilon, weight_decay;
  float update_scale;    // the orthogonalised update's factor, from the matrix's shape (optim/muon.h)
  int64_t step;          // 1-based, for bias correction
  float gradient_scale;  // as AdamWStep's
};

// Keller Jordan's quintic Newton-Schulz coefficients and step count, optax's defaults (scale_by_muon's
// ns_coeffs and ns_steps): MaxText exposes neither, so neither is a config key.
inline constexpr double kNewtonSchulzA = 3.4445, kNewtonSchulzB = -4.7750, kNewtonSchulzC = 2.0315;
inline constexpr int kNewtonSchulzSteps = 5;

// FLOPs of one matrix's Newton-Schulz orthogonalisation (2 per multiply-add, 1 per other operation): the
// Frobenius norm and the normalisation (3 m n), then per step X X^T (2 n n m), A A (2 n^3), b A + c A A
// (3 n^2), B X (2 n n m) and a X + B X (2 n m).
inline double newton_schulz_flops(int64_t rows, int64_t cols) {
  const double n = static_cast<double>(std::min(rows, cols)), m = static_cast<double>(std::max(rows, cols));
  return 3.0 * m * n + kNewtonSchulzSteps * (4.0 * n * n * m + 2.0 * n * n * n + 3.0 * n * n + 2.0 * m * n);
}

// Layout of the unembedding weight (unembed_cross_entropy, unembed_logits).
// kernel_DV: untied output projection W [D, V], logits = h @ W.
// table_VD: tied embedding table E [V, D], logits = h @ E^T.
enum class UnembedLayout { kernel_DV, table_VD };

// Tokens per chunk of the fused unembedding + cross-entropy (the chunk_tokens argument): chunks of at most
// 32M logits (128 MiB of float32) keep the full [N, V] matrix from ever existing; larger chunks mean fewer
// passes over the [V, D] table and its gradient, but a logits block that leaves the caches. 32M against 64M,
// measured 2026-12-06 06:00-06:09 (AMX Xeon, 2 threads, quiet, builds interleaved twice; bench/README.md):
// gpt2-124m (N 2048) bf16 fwd + bwd 430-443 ms against 614-676 ms, float32 1296-1524 against 1289-1352 ms;
// qwen3-0.6b at S 2048 bf16, the traced loss op 2158 against 2134 ms. (64M had looked faster in an earlier
// harness the same day; bench_kernels at the model's chunk did not confirm it.) The N tokens are split into
// equal chunks under that cap (N = 2048 at V = 50257: 4 x 512, not 3 x 667 + 47): every chunk passes over the
// whole table and its gradient, and a 47-token chunk paid that for a fourteenth of the work (the bf16 kernel,
// fwd + bwd: median 542 -> 474 ms, bench/README.md). The model sizes its scratch with it and bench_kernels
// times the kernel at it.
inline int64_t cross_entropy_chunk_tokens(int64_t N, int64_t V) {
  const int64_t cap = std::max<int64_t>((int64_t{1} << 25) / V, 1);
  if (N <= cap) return std::max<int64_t>(N, 1);
  const int64_t chunks = (N + cap - 1) / cap;
  return (N + chunks - 1) / chunks;
}

// Tokens of one weight-gradient product of the bf16 loss (dW += h^T dlogits, dE += dlogits^T h): a whole
// number of chunks, whose bf16 dlogits the loss keeps until the product runs. Each such product reads and
// writes all of dW [V, D] in float32 and is short (its reduction is over tokens), so at a large vocabulary
// one per chunk (qwen3-0.6b: 205 tokens) ran at a third of the peak. Groups of about 1,000 tokens, at most
// 128M bf16 dlogits (256 MiB), equal in chunks but the last; the dh product and the float32 path stay per
// chunk (oneDNN ran dh slower at 4x the rows: 583 -> 899 ms). Measured, AMX Xeon, 2 threads, qwen3-0.6b N =
// 2048: dE 870 ms at 205 tokens, 573 ms at 820 (bench/README.md).
inline int64_t cross_entropy_group_tokens(int64_t N, int64_t chunk_tokens, int64_t V) {
  constexpr int64_t kTargetTokens = 1000, kMaxLogits = int64_t{1} << 27;
  if (N <= chunk_tokens) return std::max<int64_t>(std::min(N, chunk_tokens), 1);
  const int64_t chunks = (N + chunk_tokens - 1) / chunk_tokens;
  const int64_t by_memory = std::max<int64_t>(kMaxLogits / (chunk_tokens * V), 1);
  const int64_t per_group = std::clamp<int64_t>(kTargetTokens / chunk_tokens, 1, by_memory);
  const int64_t groups = (chunks + per_group - 1) / per_group;
  return (chunks + groups - 1) / groups * chunk_tokens;
}

struct CrossEntropySums {
  double loss_sum = 0.0;    // sum over counted tokens of -log softmax(logits)[target]
  int64_t valid_count = 0;  // number of counted tokens (mask != 0)
  // sum over counted tokens of m logsumexp(logits)^2 (z-loss, m = z_loss_multiplier); 0 when m = 0
  double z_loss_sum = 0.0;
};

// Vocab-parallel: this rank holds global vocabulary rows [vocab_offset, vocab_offset + V) of the padded
// vocabulary (t * V rows); the per-row statistics are combined over the tensor ranks by the two callbacks
// (all-reduce in place over the ranks; every rank calls them in the same order, once per chunk).
struct VocabParallel {
  int64_t vocab_offset = 0;
  // Per-row maxima [rows]: max over the ranks.
  std::function<void(float* values, int64_t count)> all_reduce_max;
  // [2 * rows]: per-row sums of exp, then per-row target logits: sum over the ranks.
  std::function<void(double* values, int64_t count)> all_reduce_sum;
};

// Mixture-of-experts routing (moe_router_forward / moe_router_backward, moe_balance_loss_*). Config keys in
// brackets; their ranges are validated by the config before any kernel runs (the kernels only MT_CHECK them).
enum class RouterScore { softmax, sigmoid };  // [routed_score_func]

struct MoeRouting {
  RouterScore score_function = RouterScore::softmax;
  int64_t top_k = 1;             // k experts per token [num_experts_per_tok], 1 <= k <= Gk * E / G
  int64_t groups = 1;            // G routing groups [n_routing_groups]: 1 = no group limit; divides E; <= 64
  int64_t groups_kept = 1;       // Gk groups a token may use [topk_routing_group], 1 <= Gk <= G
  bool normalize_top_k = false;  // divide the k weights by their sum [norm_topk_prob]
  float scaling = 1.0f;          // multiplies the weights last [routed_scaling_factor]
};

}  // namespace meshtrain::kernels
