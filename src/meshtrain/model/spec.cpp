#include "meshtrain/model/spec.h"

#include <algorithm>
#include <numeric>

#include "meshtrain/core/error.h"
#include "meshtrain/model/families.h"

namespace meshtrain {
namespace {

void require_positive(const std::string& key, int64_t value, const std::string& hint) {
  if (value <= 0) fail("config key '" + key + "'", "a positive integer", std::to_string(value), hint);
}

// Every shape rule is checked here, before any buffer is declared or allocated.
ModelDims validate_and_size(const Config& c, const ShardingLayout& sharding) {
  const DecoderFamily& family = family_of(c);
  const std::string preset_hint = "set it, or start from a preset such as qwen3-tiny";
  require_positive("base_emb_dim", c.base_emb_dim, preset_hint);
  require_positive("base_num_query_heads", c.base_num_query_heads, preset_hint);
  require_positive("base_num_kv_heads", c.base_num_kv_heads, preset_hint);
  require_positive("base_mlp_dim", c.base_mlp_dim, preset_hint);
  require_positive("base_num_decoder_layers", c.base_num_decoder_layers, preset_hint);
  require_positive("vocab_size", c.vocab_size, "set it to the tokenizer's vocabulary size");
  require_positive("max_target_length", c.max_target_length, "the sequence length, e.g. 128");
  require_positive("per_device_batch_size", c.per_device_batch_size, "e.g. 4");
  require_positive("gradient_accumulation_steps", c.gradient_accumulation_steps, "1 for no accumulation");

  ModelDims m;
  m.D = c.base_emb_dim;
  m.H = c.base_num_query_heads;
  m.K = c.base_num_kv_heads;
  m.F = c.base_mlp_dim;
  m.L = c.base_num_decoder_layers;
  m.V_valid = c.vocab_size;
  const bool mla = c.attention_type == AttentionType::mla;
  if (mla) {
    // head_dim is not read: the attention core's head width is that of q and k (model/layers/mla.h).
    m.d = c.qk_nope_head_dim + c.qk_rope_head_dim;
    if (m.K != m.H) {
      fail("config key 'base_num_kv_heads'",
           "base_num_query_heads (" + std::to_string(m.H) + ") under attention_type=mla", std::to_string(m.K),
           "multi-head latent attention expands one key / value per query head");
    }
  } else {
    m.d = c.head_dim;
  }
  if (m.d == 0) {  // derived from the width, as in GPT-2
    if (m.D % m.H != 0) {
      fail("config keys 'base_emb_dim' / 'base_num_query_heads'", "heads dividing the width",
           std::to_string(m.D) + " / " + std::to_string(m.H),
           "set head_dim, or a head count that divides base_emb_dim");
    }
    m.d = m.D / m.H;
  }
  require_positive("head_dim", m.d, "e.g. 64 or 128");
  if (m.H % m.K != 0) {
    fail("config key 'base_num_kv_heads'", "a divisor of base_num_query_heads (" + std::to_string(m.H) + ")",
         std::to_string(m.K), "grouped-query attention shares each kv head among H/K query heads");
  }
  if (family.positions == PositionKind::rotary && !mla && m.d % 2 != 0) {
    fail("config key 'head_dim'", "an even number (RoPE rotates pairs of dimensions)", std::to_string(m.d));
  }
  if (family.positions == PositionKind::learned) {
    require_positive("max_position_embeddings", c.max_position_embeddings, "1024 for GPT-2");
    if (c.max_target_length > c.max_position_embeddings) {
      fail("config key 'max_target_length'",
           "at most max_position_embeddings (" + std::to_string(c.max_position_embeddings) +
               ") for learned positions",
           std::to_string(c.max_target_length));
    }
    m.P = c.max_position_embeddings;
  }
  if (family.always_tied && !c.logits_via_embedding) {
    fail("config key 'logits_via_embedding'",
         std::string("true for ") + decoder_block_name(c.decoder_block) + " (tied embeddings)", "false");
  }
  // Per-device sizes. The micro-batch of all devices is per_device_batch_size x devices rows (the
  // reference system's rule, whatever the mesh), split over data x fsdp.
  const Mesh& mesh = sharding.mesh();
  m.B = sharding.local_size("batch", c.per_device_batch_size * mesh.devices());
  m.S = sharding.local_size("length", c.max_target_length);
  m.N = m.B * m.S;
  m.H = sharding.local_size("heads", m.H);
  m.K = sharding.local_size("kv_heads", m.K);
  if (m.H % m.K != 0) {
    fail("config key 'mesh.tensor'", "a degree that keeps query heads a multiple of kv heads on each device",
         std::to_string(mesh.size(MeshAxis::tensor)),
         "use a tensor degree dividing base_num_kv_heads, or a multiple of it");
  }
  m.F = sharding.local_size("mlp", m.F);
  m.G = c.mhc_expansion_rate;
  const int64_t vocab_degree = sharding.compute("vocab").degree;
  m.V_padded = padded_vocab_size(c.vocab_size, vocab_degree);
  m.V = m.V_padded / vocab_degree;
  if (c.normalization_layer_epsilon <= 0.0) {
    fail("config key 'normalization_layer_epsilon'", "a positive number",
         to_text(c.normalization_layer_epsilon));
  }
  return m;
}

}  // namespace

uint16_t* OpContext::bf16(BufferId id) const {
  if (id == kNoBuffer) return nullptr;
  const TensorView bits = view(id);
  MT_CHECK(bits.dtype == DType::bf16, "tensor is not bfloat16");
  return static_cast<uint16_t*>(bits.data);
}

uint8_t* OpContext::u8(BufferId id) const {
  const TensorView bytes = view(id);
  MT_CHECK(bytes.dtype == DType::u8, "tensor is not uint8");
  return static_cast<uint8_t*>(bytes.data);
}

int64_t padded_vocab_size(int64_t vocab_size, int64_t tensor_degree) {
  const int64_t multiple = std::lcm<int64_t>(128, tensor_degree);
  return (vocab_size + multiple - 1) / multiple * multiple;
}

const char* buffer_kind_name(BufferKind kind) {
  switch (kind) {
    case BufferKind::parameter:
      return "parameter";
    case BufferKind::gradient:
      return "gradient";
    case BufferKind::optimizer_state:
      return "optimizer_state";
    case BufferKind::step_counter:
      return "step_counter";
    case BufferKind::cache:
      return "cache";
    case BufferKind::input:
      return "input";
    case BufferKind::activation:
      return "activation";
    case BufferKind::scratch:
      return "scratch";
    case BufferKind::communication:
      return "communication";
  }
  return "?";
}

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::matmul:
      return "matmul";
    case OpKind::attention:
      return "attention";
    case OpKind::elementwise:
      return "elementwise";
    case OpKind::loss:
      return "loss";
    case OpKind::optimizer:
      return "optimizer";
    case OpKind::memory:
      return "memory";
    case OpKind::collective:
      return "collective";
  }
  return "?";
}

const char* collective_kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return "all_reduce";
    case CollectiveKind::all_gather:
      return "all_gather";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
    case CollectiveKind::send_recv:
      return "send_recv";
    case CollectiveKind::all_to_all:
      return "all_to_all";
  }
  return "?";
}

int64_t ModelSpec::parameter_count() const {
  int64_t count = 0;
  for (const ParameterDecl& parameter : parameters) count += buffer(parameter.value).shape.elements();
  return count;
}

ModelSpec build_model_spec(const Config& config) {
  return build_model_spec(config, Mesh{}, kernels::kernel_backend_for_device("cpu"));
}

namespace {

// The chunk with its last layer resolved; a range outside the model's layers is an error naming it.
LayerChunk resolve_chunk(LayerChunk chunk, int64_t layers) {
  if (chunk.last_layer < 0) chunk.last_layer = layers - 1;
  if (chunk.first_layer < 0 || chunk.first_layer > chunk.last_layer || chunk.last_layer >= layers) {
    fail("layer chunk [" + std::to_string(chunk.first_layer) + ", " + std::to_string(chunk.last_layer) + "]",
         "a range of the model's layers 0 .. " + std::to_string(layers - 1), "a range outside them",
         "cut the model within base_num_decoder_layers");
  }
  return chunk;
}

// A training spec (cache_length 0) or a decode spec: the same layer functions declare both.
ModelSpec build_spec(const Config& config, const Mesh& mesh, int64_t cache_length,
                     const kernels::KernelBackend& backend, const std::vector<LayerChunk>& chunks) {
  ModelSpec spec;
  spec.config = config;
  spec.options = model_options(config);
  spec.kernels = &backend;
  spec.sharding = ShardingLayout(config.logical_axis_rules, mesh);
  spec.dims = validate_and_size(config, spec.sharding);
  MT_CHECK(!chunks.empty(), "a spec of at least one chunk");
  for (const LayerChunk& chunk : chunks) spec.chunks.push_back({resolve_chunk(chunk, spec.dims.L), {}});
  if (cache_length > 0) {
    spec.dims.B = spec.dims.S = spec.dims.N = 1;
    spec.dims.T = cache_length;
  }
  SpecBuilder builder(spec);
  const Shape batch_shape = shape_of({{"batch", spec.dims.B}, {"length", spec.dims.S}});
  spec.tokens = builder.input("batch/tokens", DType::i32, batch_shape);
  if (!spec.decoding()) spec.targets = builder.input("batch/targets", DType::i32, batch_shape);
  spec.positions = builder.input("batch/positions", DType::i32, batch_shape);
  if (!spec.decoding()) {
    spec.segment_ids = builder.input("batch/segment_ids", DType::i32, batch_shape);
    spec.loss_mask = builder.input("batch/loss_mask", DType::u8, batch_shape);
  }
  family_of(config).build(builder);
  builder.finish();
  return spec;
}

}  // namespace

ModelSpec build_model_spec(const Config& config, const Mesh& mesh, const kernels::KernelBackend& backend,
                           const std::vector<LayerChunk>& chunks) {
  return build_spec(config, mesh, 0, backend, chunks);
}

ModelSpec build_decode_spec(const Config& config, const Mesh& mesh, int64_t cache_length,
                            const kernels::KernelBackend& backend) {
  MT_CHECK(cache_length > 0, "a decode spec needs a cache of at least one row");
  return build_spec(config, mesh, cache_length, backend, {LayerChunk{}});
}

StandardFlops standard_training_flops(const Config& c) {
  const double B = static_cast<double>(c.per_device_batch_size), S = static_cast<double>(c.max_target_length);
  const double emb = static_cast<double>(c.base_emb_dim), mlp = static_cast<double>(c.base_mlp_dim);
  const double Hq = static_cast<double>(c.base_num_query_heads),
               Hkv = static_cast<double>(c.base_num_kv_heads);
  const double hd =
      static_cast<double>(c.head_dim > 0 ? c.head_dim : c.base_emb_dim / c.base_num_query_heads);
  const double L = static_cast<double>(c.base_num_decoder_layers), vocab = static_cast<double>(c.vocab_size);
  const double input_matmuls = static_cast<double>(family_of(c).mlp_input_matmuls());
  const double ffn = 2 * B * S * mlp * emb * input_matmuls + 2 * B * S * mlp * emb;
  double qkv = 2 * B * S * emb * (Hq + 2 * Hkv) * hd;
  double projection = 2 * B * S * emb * Hq * hd;
  double attention = 4 * B * S * S * Hq * hd / 2;
  if (c.attention_type == AttentionType::mla) {
    // Multi-head latent attention: the low-rank projections, q / k of width nope + rope and v of v_head_dim
    // (the padding of v to the q / k width in the core is not counted: standard FLOPs are the model's).
    const double rq = static_cast<double>(c.q_lora_rank), rkv = static_cast<double>(c.kv_lora_rank);
    const double nope = static_cast<double>(c.qk_nope_head_dim),
                 rope = static_cast<double>(c.qk_rope_head_dim);
    const double dv = static_cast<double>(c.v_head_dim), dq = nope + rope;
    const double query = rq > 0 ? 2 * B * S * (emb * rq + rq * Hq * dq) : 2 * B * S * emb * Hq * dq;
    qkv = query + 2 * B * S * emb * (rkv + rope) + 2 * B * S * rkv * Hq * (nope + dv);
    projection = 2 * B * S * Hq * dv * emb;
    attention = 2 * B * S * S * Hq * (dq + dv) / 2;
  }
  const double unembedding = 2 * B * S * emb * vocab;
  const double accumulation = static_cast<double>(c.gradient_accumulation_steps);
  // Mixture of experts: the layers after first_num_dense_layers run the router and, per token, its k routed
  // experts and the shared ones (SwiGLU of base_moe_mlp_dim each) in place of the dense MLP.
  double feed_forward = L * ffn;
  if (c.num_experts > 0) {
    const double moe_layers =
        L - static_cast<double>(std::min(c.first_num_dense_layers, c.base_num_decoder_layers));
    const double experts_per_token = static_cast<double>(c.num_experts_per_tok + c.shared_experts);
    const double expert = 3 * 2 * B * S * emb * static_cast<double>(c.base_moe_mlp_dim);
    const double router = 2 * B * S * emb * static_cast<double>(c.num_experts);
    feed_forward = (L - moe_layers) * ffn + moe_layers * (experts_per_token * expert + router);
  }
  // Engram (shared/specs/engram.md section 8) on each layer it names: the key and value projections and the
  // ShortConv are learnable; the gate's q . k is a product of activations, counted with attention. mHC
  // (mhc.md) at both sites of every layer: the coefficient projection, and the collapse and expand mixes.
  const double G = static_cast<double>(c.mhc_expansion_rate);
  double engram_learnable = 0.0, engram_products = 0.0;
  if (!c.engram_layers.empty()) {
    const double layers = static_cast<double>(c.engram_layers.size());
    const double engram_dim =
        static_cast<double>(c.engram_num_heads * (c.engram_max_ngram_size - 1) * c.engram_head_dim);
    const double taps = static_cast<double>(c.engram_kernel_size);
    engram_learnable = layers * (2 * B * S * engram_dim * G * emb + 2 * B * S * engram_dim * emb +
                                 2 * B * S * taps * G * emb);
    engram_products = layers * 2 * B * S * G * emb;
  }
  double mhc_learnable = 0.0, mhc_products = 0.0;
  if (c.mhc_expansion_rate > 1) {
    const double sites = 2 * L;
    mhc_learnable = sites * 2 * B * S * (G * emb) * (2 * G + G * G);
    mhc_products = sites * (2 * B * S * G * emb + 2 * B * S * G * (G + 1) * emb);
  }
  return {3 * (feed_forward + L * (qkv + projection) + unembedding + engram_learnable + mhc_learnable) *
              accumulation,
          3 * (L * attention + engram_products + mhc_products) * accumulation};
}

void RoutingSums::add(const RoutingSums& other) {
  const auto add_into = [](std::vector<double>& into, const std::vector<double>& from) {
    if (into.empty()) into.assign(from.size(), 0.0);
    for (size_t i = 0; i < from.size(); ++i) into[i] += from[i];
  };
  add_into(expert_load, other.expert_load);
  add_into(dropped, other.dropped);
  add_into(balance_loss, other.balance_loss);
}

}  // namespace meshtrain
