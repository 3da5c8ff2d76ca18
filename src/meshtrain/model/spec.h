// The model as a spec: every parameter, gradient, input, saved activation and scratch buffer is declared
// once with a shape of logical axes, and the forward and backward passes are explicit op lists over those
// buffers; the optimizer pass (optim/) adds its state and update ops to a training spec. Allocation,
// parameter counts, FLOPs, checkpoint names and (later) the memory plan and sharding all read this one
// description.
//
// Every size is per device: the sharding pass (mesh/sharding.h) divides the logical sizes before the layers
// declare anything, so FLOPs and bytes are per device too.
//
// Legend: B batch, S sequence, N tokens (= B*S), D width, H query heads, K kv heads, d head width,
// F MLP width, V vocab (padded), P learned positions, L layers, G residual streams (mHC).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/tensor.h"
#include "meshtrain/kernels/backend.h"
#include "meshtrain/kernels/collectives.h"
#include "meshtrain/mesh/sharding.h"
#include "meshtrain/model/options.h"

namespace meshtrain {

// communication: a parameter gathered for use, or a gradient before it is reduce-scattered (the plan's);
// optimizer_state, step_counter: declared by the optimizer pass (optim/optimizer.h), the step kept apart
// from the moments; cache: a decode step's key / value rows, kept across steps.
enum class BufferKind {
  parameter,
  gradient,
  optimizer_state,
  step_counter,
  cache,
  input,
  activation,
  scratch,
  communication
};
const char* buffer_kind_name(BufferKind kind);
enum class ParameterInit { normal, ones, zeros, constant };

using BufferId = int32_t;
inline constexpr BufferId kNoBuffer = -1;

struct BufferDecl {
  std::string name;  // parameters: checkpoint name, e.g. "decoder/layers_0/mlp/wo/kernel"
  BufferKind kind;
  DType dtype;
  Shape shape;
  // A layer's value or gradient inside a stacked parameter (scan_layers): no storage of its own, it views
  // block `stack_index` of the layer axis of `stack` (outermost in memory, so every block is contiguous).
  BufferId stack = -1;
  int64_t stack_index = 0;
};

// What a parameter is, for the optimizer's rules (optim/groups.h: which roles decay, which Muon steps): a
// hidden linear map's weights (attention, MLA, MLP, expert and Engram projections), the untied unembedding
// (head), the MoE router's gate (router), mHC's coefficient projection (mixing), Engram's convolution taps
// (convolution), an additive bias (linear, norm and mHC biases, MoE selection biases), a multiplicative scale
// (norm and mHC scales), or a lookup table (token and position embeddings, Engram's tables).
enum class ParameterRole { matrix, bias, scale, embedding, head, router, mixing, convolution };

// A trainable tensor and its gradient (a decode spec declares the value only). What an optimizer keeps
// beside it (moments, a master copy) is the optimizer pass's (optim/optimizer.h), not the spec's.
struct ParameterDecl {
  BufferId value = kNoBuffer, gradient = kNoBuffer;
  std::string canonical_name;  // init stream name: independent of sharding and layer layout
  std::string component;       // for parameter-count breakdowns: "embedding", "attention", "mlp", "norm", ...
  ParameterInit init = ParameterInit::normal;
  double init_std = 0.0;
  double init_value = 0.0;  // ParameterInit::constant
  ParameterRole role = ParameterRole::matrix;
  // A linear map's weights (matrix, head, router, mixing): how many of its leading axes, after any experts
  // axis, are the map's input (the rest its output), so Muon sees [fan_in, fan_out] matrices.
  int32_t input_axes = 1;
  // Replicated over tensor but computed from tensor-split activations (QK-norm scales see only this rank's
  // heads): each rank's gradient is a partial sum, all-reduced over tensor in update.
  bool gradient_partial_over_tensor = false;
  // A scan group's parameter stored stacked (scan_layers): value and gradient (and so the optimizer's
  // moments) are [layers, ...], and `members` are the layers' slices in layer order, each with its
  // per-layer canonical name (its init stream) and norm slot. Empty: a parameter of its own.
  struct Member {
    BufferId value = kNoBuffer, gradient = kNoBuffer;  // views of block i of value / gradient
    std::string canonical_name;
    int32_t norm_slot = 0;
  };
  std::vector<Member> members;
  // Where its squared gradient norm goes in UpdateState::norm_slots (stacked: the members' slots): the
  // per-layer layout's parameter order, so both layouts sum the same partial norms in the same order.
  int32_t norm_slot = 0;
  bool stacked() const { return !members.empty(); }
};

// Routing statistics of the MoE layers over kernel calls, per MoE layer in layer order (ModelSpec::
// moe_layers): what the step's metrics report once summed over micro-batches and ranks. Doubles, so sums
// over ranks stay exact (to 2^53) in one all-reduce.
struct RoutingSums {
  std::vector<double> expert_load;   // [moe layers, E] assignments per expert before capacity dropping
  std::vector<double> dropped;       // [moe layers] assignments dropped by capacity
  std::vector<double> balance_loss;  // [moe layers] the balance loss summed over tokens (weight included)

  void add(const RoutingSums& other);
};

// Loss sums of one kernel call: the step divides by the GLOBAL valid-token count, never per micro-batch.
// The training objective is (loss_sum + z_loss_sum + the balance losses' sum) / global valid count.
struct LossSums {
  double loss_sum = 0.0;    // cross-entropy
  double z_loss_sum = 0.0;  // z_loss_multiplier x logsumexp(logits)^2 (the loss op's; 0 without a z-loss)
  int64_t valid_count = 0;
  RoutingSums routing;
};

// What the update kernel's ops (optim/optimizer.h) share: the step's arguments and the norm they compute
// together.
struct UpdateState {
  int64_t global_valid_count = 0;
  double learning_rate = 0.0;
  int64_t step = 0;             // 0-based; Adam's bias correction uses step + 1
  double sum_of_squares = 0.0;  // of the summed (not yet token-averaged) gradients
  // Each per-layer parameter's squared norm (ParameterDecl::norm_slot), added into sum_of_squares in slot
  // order by fold_norm_slots() before the norm is reduced or used: a sum independent of the layout.
  std::vector<double> norm_slots;
  void fold_norm_slots() {
    for (double& slot : norm_slots) {
      sum_of_squares += slot;
      slot = 0.0;
    }
  }
  double raw_grad_norm = 0.0, grad_norm = 0.0, gradient_scale = 0.0;  // set by the clip op
  bool nonfinite = false;  // set by the clip op: the AdamW ops then leave every parameter unchanged
};

// What an op sees when it runs: pointers into the arena, the kernels to call on them, and the loss sums it
// may add to.
class OpContext {
 public:
  virtual ~OpContext() = default;
  virtual TensorView view(BufferId id) const = 0;
  float* f32(BufferId id) const { return view(id).f32(); }
  int32_t* i32(BufferId id) const { return view(id).i32(); }
  uint8_t* u8(BufferId id) const;
  // bfloat16 bits; nullptr for kNoBuffer (a bf16 scratch a float32 run does not declare).
  uint16_t* bf16(BufferId id) const;
  // The ops' only way to their kernels (the spec's backend, set by the engine).
  const kernels::KernelBackend* kernels = nullptr;
  LossSums* loss_sums = nullptr;
  UpdateState* update = nullptr;
  // This rank's share of a sum over ranks that hold the same values (1 / replicas): a gradient replicated
  // over an axis its norm is all-reduced on counts once.
  double share = 1.0;
  MeshCoordinates coordinates;  // this rank's place on the mesh (shard offsets)
  // What the op may call on other ranks while it runs (kernels/collectives.h), set by the engine.
  const kernels::TensorGroup* tensor = nullptr;        // null: one tensor rank
  const kernels::ContextRing* context_ring = nullptr;  // null: one context rank
  bool recomputing = false;  // a remat recompute of a forward op: statistics were counted the first time
};

// What an op is, for costs and for remat policies (`minimal` keeps matmul and attention outputs).
enum class OpKind { matmul, attention, elementwise, loss, optimizer, memory, collective };
const char* op_kind_name(OpKind kind);

enum class CollectiveKind { all_reduce, all_gather, reduce_scatter, send_recv, all_to_all };
const char* collective_kind_name(CollectiveKind kind);

// A collective over one mesh axis. `buffer` is the full-size side: the all-reduced buffer, the all-gather's
// output, the reduce-scatter's input, the all-to-all's send buffer; `shard` the other side of a gather or
// scatter, or the all-to-all's receive buffer (the same size). Bytes per rank follow
// aot-plan.md and are computed by the plan from the buffers' planned dtypes.
struct CollectiveDecl {
  CollectiveKind kind = CollectiveKind::all_reduce;
  MeshAxis axis = MeshAxis::data;
  int64_t group = 1;  // ranks in the group (kv-head replication uses part of the tensor axis)
  BufferId buffer = kNoBuffer, shard = kNoBuffer;
  // Shards split the full buffer at a dim with `outer` elements' worth of dims before it: with outer > 1 a
  // shard is strided, and the plan gives the op a staging buffer to pack / unpack through.
  int64_t outer = 1;
  BufferId staging = kNoBuffer;
  // Accounting only: the traffic happens inside the next op (the vocab-parallel loss's per-chunk
  // statistics, ring attention's passes); the plan counts it here, the engine runs nothing.
  bool inside_next_op = false;
  // send_recv: the buffer is passed this many times (a ring's steps); bytes are per pass times repeats.
  int64_t repeats = 1;
  // send_recv: `buffer` goes to the rank this far along the axis (modulo its size) and `shard` comes from
  // the rank as far back; either may be kNoBuffer (a pipeline's first stage receives nothing).
  int64_t peer_offset = 1;
};

// What an op is for, where the planner or the engine treats it specially (op names are for people, plan
// files and traces; code tests the role). `model`: an op of the forward, loss or backward.
enum class OpRole {
  model,
  step_counter,               // optimizer/step
  grad_norm,                  // optimizer/grad_norm/<parameter>: adds its squared norm
  clip,                       // optimizer/clip: the global norm's scale
  adamw,                      // optimizer/adamw/<parameter>
  muon,                       // optimizer/muon/<parameter>
  zero_gradients,             // optimizer/zero_gradients: fwd_bwd starts the accumulators at zero
  reduce_valid_count,         // optimizer/reduce_valid_count/<axis>: the global valid-token count
  reduce_grad_norm,           // optimizer/reduce_grad_norm/<axis>: the squared norm's partial sums
  tensor_gradient_reduction,  // tensor/all_reduce/<parameter>: partial gradients over tensor
  kv_replica_reduction,       // tensor/kv_replicas_all_reduce/<parameter>
  data_gradient_reduction,    // data/all_reduce/<parameter>
  zero1_reduce_scatter,       // zero1/reduce_scatter/<parameter>
  zero1_slice,                // zero1/slice/<parameter>: a strided data shard copied out
  zero1_all_gather,           // zero1/gather/<parameter>
  muon_gather,                // muon/gather/<parameter>/<tensor>/<axis>: a sharded Muon matrix made whole
  muon_slice,                 // muon/slice/<parameter>/<tensor>: this rank's shard of the whole step's result
  fsdp_gather,                // fsdp/gather/<parameter>[#backward]
  fsdp_zero,                  // fsdp/zero/<parameter>: the full gradient before its first write
  fsdp_reduce_scatter,        // fsdp/reduce_scatter/<parameter>
  tied_embedding_reduction,   // stage/tied_all_reduce/<parameter>: a pipeline's two ends' table gradients
};

// One op. Reads and writes list every buffer the op touches (the engine refuses any other): an op that adds
// into a buffer lists it in both; a buffer written and not read is overwritten, which ends its previous value
// for the memory plan. Gradient buffers are always accumulated into.
struct OpDecl {
  OpDecl() = default;
  OpDecl(std::string op_name, std::vector<BufferId> op_reads, std::vector<BufferId> op_writes,
         double op_flops, std::function<void(const OpContext&)> op_run, OpKind op_kind = OpKind::elementwise,
         CollectiveDecl op_collective = {})
      : name(std::move(op_name)),
        reads(std::move(op_reads)),
        writes(std::move(op_writes)),
        flops(op_flops),
        run(std::move(op_run)),
        kind(op_kind),
        collective(op_collective) {}

  std::string name;  // "decoder/layers_0/attention/forward"
  std::vector<BufferId> reads, writes;
  double flops = 0.0;
  std::function<void(const OpContext&)> run;  // empty for collectives until the distributed runtime
  OpKind kind = OpKind::elementwise;
  CollectiveDecl collective;  // kind == collective only
  OpRole role = OpRole::model;
  int32_t parameter = -1;  // index in ModelSpec::parameters of the one parameter the op is for; -1 none
  // A backward op that only adds into weight gradients (a dense projection's dW and db): nothing later in the
  // backward reads what it writes, so zero_bubble's W op may run it after the input gradients (B_input).
  bool weight_gradients_only = false;
};

// A layer's forward ops (a range of ModelSpec::forward) and its backward ops (a range of loss_backward):
// the unit remat policies recompute.
struct LayerBlock {
  std::string name;
  size_t forward_begin = 0, forward_end = 0, backward_begin = 0, backward_end = 0;
};

struct ModelDims {
  int64_t B = 0, S = 0, N = 0, D = 0, H = 0, K = 0, d = 0, F = 0, L = 0;
  int64_t G = 1;         // residual streams (mhc_expansion_rate; 1: a plain residual)
  int64_t V = 0;         // padded vocabulary rows on this device
  int64_t V_valid = 0;   // the tokenizer's vocabulary; rows at and past it are never predicted
  int64_t P = 0;         // learned position rows (gpt2)
  int64_t V_padded = 0;  // padded vocabulary over all tensor ranks (V x tensor degree of vocab)
  int64_t T = 0;         // decode spec: key / value cache rows (B = S = 1); 0 in a training spec
};

// An Engram layer (model/layers/engram.h) as the data path, the checkpoint and decoding see it.
struct EngramLayerSpec {
  int64_t layer = 0;                  // global layer index
  std::vector<int64_t> table_sizes;   // [H (N - 1)] each head's table rows (distinct primes), order 2 first
  int64_t table_rows = 0;             // sum(table_sizes): the rows a lookup may address
  BufferId hash_ids = kNoBuffer;      // input [B, S, H (N - 1)] int32: each head's row in its own table
  BufferId conv_history = kNoBuffer;  // decode: cache [(K - 1) N, G D], the ShortConv's last inputs
};

// A contiguous range of decoder layers, with or without the embedding before them and the final norm,
// unembedding and loss after them: a pipeline stage's chunk (shared/specs/pipeline.md). The default is the
// whole model.
struct LayerChunk {
  int64_t first_layer = 0;
  int64_t last_layer = -1;  // inclusive; -1: the model's last
  bool with_embedding = true;
  bool with_head = true;  // the final norm, the unembedding and the loss
};

// Where a chunk meets its pipeline neighbours (kNoBuffer where it has none): the previous chunk's activation
// it reads (chunk/input) and the gradient its backward leaves for it; the activation its last layer writes
// for the next chunk and the gradient buffer its backward starts from (the residual's, or under mHC the
// streams', [B, S, D] or [B, S, G, D]).
struct ChunkBoundary {
  BufferId input = kNoBuffer, input_gradient = kNoBuffer;    // chunks without the embedding
  BufferId output = kNoBuffer, output_gradient = kNoBuffer;  // chunks without the head
};

// One chunk a spec holds: its layers, its boundary, and where its ops lie: [forward_begin, forward_end) in
// ModelSpec::forward, [backward_begin, backward_end) in ModelSpec::loss_backward (the head's chunk's
// starting with the loss). A whole-model spec holds one; a pipeline stage rank with virtual stages
// (num_pipeline_repeats) several, in layer order, each run as kernels of its own.
struct ChunkSection {
  LayerChunk layers;
  ChunkBoundary boundary;
  size_t forward_begin = 0, forward_end = 0, backward_begin = 0, backward_end = 0;
};

struct ModelSpec {
  // The whole config, for what reads the run's keys beside the layers (the optimizer's, the plan's, the
  // checkpoint's); the layers read only `options`, theirs filled from it once.
  Config config;
  ModelOptions options;
  std::vector<ChunkSection> chunks;  // the layers it holds (last_layer resolved), in layer order
  // The backend its ops run on (the engine hands it to them) and its kernel scratch is sized for.
  const kernels::KernelBackend* kernels = nullptr;
  ShardingLayout sharding;
  ModelDims dims;
  std::vector<BufferDecl> buffers;
  std::vector<ParameterDecl> parameters;
  // Batch inputs, each [B, S].
  BufferId tokens = kNoBuffer, targets = kNoBuffer, positions = kNoBuffer, segment_ids = kNoBuffer,
           loss_mask = kNoBuffer;
  BufferId final_hidden = kNoBuffer;  // [N, D] after the final norm (sampling reads it)
  // token_embedder/embedding's value where this spec holds it: the first chunk, and with tied embeddings the
  // last (a pipeline's two ends sum their gradients of it).
  BufferId embedding_table = kNoBuffer;
  BufferId logits = kNoBuffer;  // decode spec: [1, V] next-token logits, padding rows -inf
  // Embedding .. final norm; a decode spec: the same layers' ops for one token (attention through its
  // caches), then the logits.
  std::vector<OpDecl> forward;
  std::vector<OpDecl> loss_forward;   // loss only (eval)
  std::vector<OpDecl> loss_backward;  // loss with its gradient, then the backward of every layer
  std::vector<LayerBlock> blocks;     // decoder blocks, in forward order
  // The MoE layers' names ("decoder/layers_3"), in layer order, and their routed experts E (one E for all).
  std::vector<std::string> moe_layers;
  int64_t moe_experts = 0;
  // Per MoE layer, its selection bias [E] (routed_bias; kNoBuffer otherwise): a parameter no gradient
  // reaches (AdamW leaves it as it is), moved after each step by the load-based update instead
  // (Engine::update_selection_biases), so checkpoints and resharding treat it as every parameter.
  std::vector<BufferId> moe_selection_biases;
  // The Engram layers, in engram_layers order (empty without Engram).
  std::vector<EngramLayerSpec> engram;
  int32_t norm_slots = 0;  // UpdateState::norm_slots entries: one per per-layer parameter

  const BufferDecl& buffer(BufferId id) const { return buffers.at(static_cast<size_t>(id)); }
  int64_t parameter_count() const;
  // A decode spec: forward ops only (no gradients, loss or backward; no optimizer is applied to it), batch
  // inputs tokens and positions only.
  bool decoding() const { return dims.T > 0; }
  // Whether a chunk holds the final norm, the unembedding and the loss.
  bool with_head() const { return chunks.back().layers.with_head; }
};

// Checks the model's shape rules at the sizes of `mesh` (before anything is allocated; the config's own
// rules are load_config's, and plan_training's against the resolved mesh) and builds the spec of its
// decoder_block at the per-device sizes of `mesh`, for the kernels of `backend`; the one-argument form is
// one cpu device. `chunks`: only those layers, each chunk in turn (a chunk without the embedding reads its
// residual stream from an input, "chunk/input", or "chunk_<k>/input" for the k-th chunk).
ModelSpec build_model_spec(const Config& config, const Mesh& mesh, const kernels::KernelBackend& backend,
                           const std::vector<LayerChunk>& chunks = {LayerChunk{}});
ModelSpec build_model_spec(const Config& config);
// The decode spec of the same layers: one token (B = S = 1) attending over caches of `cache_length` rows.
ModelSpec build_decode_spec(const Config& config, const Mesh& mesh, int64_t cache_length,
                            const kernels::KernelBackend& backend);

// Vocabulary rows allocated for a tokenizer vocabulary: a multiple of 128 and of the tensor degree.
int64_t padded_vocab_size(int64_t vocab_size, int64_t tensor_degree = 1);

// Standard training FLOPs per device per step (shared/specs/training-step.md), learnable and attention parts
// (the attention part: products of two activations, attention's and Engram's gate and mHC's mixes).
struct StandardFlops {
  double learnable = 0.0, attention = 0.0;
  double total() const { return learnable + attention; }
};
StandardFlops standard_training_flops(const Config& config);

}  // namespace meshtrain
