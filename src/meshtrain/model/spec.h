// The model as a spec: every parameter, gradient, optimizer moment, input, saved activation and scratch
// buffer is declared once with a shape of logical axes, and the forward and backward passes are explicit
// op lists over those buffers. Allocation, parameter counts, FLOPs, checkpoint names and (later) the memory
// plan and sharding all read this one description.
//
// Legend: B batch, S sequence, N tokens (= B*S), D width, H query heads, K kv heads, d head width,
// F MLP width, V vocab (padded), P learned positions, L layers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/tensor.h"

namespace meshtrain {

enum class BufferKind { parameter, gradient, optimizer_state, input, activation, scratch };
enum class ParameterInit { normal, ones, zeros };

using BufferId = int32_t;
inline constexpr BufferId kNoBuffer = -1;

struct BufferDecl {
  std::string name;  // parameters: checkpoint name, e.g. "decoder/layers_0/mlp/wo/kernel"
  BufferKind kind;
  DType dtype;
  Shape shape;
};

// A trainable tensor and the buffers that follow it.
struct ParameterDecl {
  BufferId value = kNoBuffer, gradient = kNoBuffer, adam_m = kNoBuffer, adam_v = kNoBuffer;
  std::string canonical_name;  // init stream name: independent of sharding and layer layout
  std::string component;       // for parameter-count breakdowns: "embedding", "attention", "mlp", "norm", ...
  ParameterInit init = ParameterInit::normal;
  double init_std = 0.0;
  bool weight_decay = true;  // no decay on norms, biases, embeddings
};

// Loss sums of one kernel call: the step divides by the GLOBAL valid-token count, never per micro-batch.
struct LossSums {
  double loss_sum = 0.0;
  int64_t valid_count = 0;
};

// What an op sees when it runs: pointers into the arena, and the loss sums it may add to.
class OpContext {
 public:
  virtual ~OpContext() = default;
  virtual TensorView view(BufferId id) const = 0;
  float* f32(BufferId id) const { return view(id).f32(); }
  int32_t* i32(BufferId id) const { return view(id).i32(); }
  uint8_t* u8(BufferId id) const;
  LossSums* loss_sums = nullptr;
};

struct OpDecl {
  std::string name;  // "decoder/layers_0/attention/forward"
  std::vector<BufferId> reads, writes;
  double flops = 0.0;
  std::function<void(const OpContext&)> run;
};

struct ModelDims {
  int64_t B = 0, S = 0, N = 0, D = 0, H = 0, K = 0, d = 0, F = 0, L = 0;
  int64_t V = 0;        // padded vocabulary (embedding rows)
  int64_t V_valid = 0;  // the tokenizer's vocabulary; rows at and past it are never predicted
  int64_t P = 0;        // learned position rows (gpt2)
};

struct ModelSpec {
  Config config;
  ModelDims dims;
  std::vector<BufferDecl> buffers;
  std::vector<ParameterDecl> parameters;
  // Batch inputs, each [B, S].
  BufferId tokens = kNoBuffer, targets = kNoBuffer, positions = kNoBuffer, segment_ids = kNoBuffer,
           loss_mask = kNoBuffer;
  BufferId final_hidden = kNoBuffer;  // [N, D] after the final norm (sampling reads it)
  std::vector<OpDecl> forward;        // embedding .. final norm
  std::vector<OpDecl> loss_forward;   // loss only (eval)
  std::vector<OpDecl> loss_backward;  // loss with its gradient, then the backward of every layer

  const BufferDecl& buffer(BufferId id) const { return buffers.at(static_cast<size_t>(id)); }
  int64_t parameter_count() const;
};

// Validates the config (before anything is allocated) and builds the spec of its decoder_block.
ModelSpec build_model_spec(const Config& config);

// Vocabulary rows allocated for a tokenizer vocabulary: a multiple of 128 (and later of the tensor degree).
int64_t padded_vocab_size(int64_t vocab_size);

// Standard training FLOPs per device per step (shared/specs/training-step.md), learnable and attention parts.
struct StandardFlops {
  double learnable = 0.0, attention = 0.0;
  double total() const { return learnable + attention; }
};
StandardFlops standard_training_flops(const Config& config);

}  // namespace meshtrain
