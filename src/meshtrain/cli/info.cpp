#include "meshtrain/cli/info.h"

#include <cstdio>
#include <map>
#include <vector>

#include "meshtrain/cli/arguments.h"
#include "meshtrain/model/layers/engram.h"
#include "meshtrain/model/segments.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/train/schedule.h"

namespace meshtrain {

int run_info(const std::vector<std::string>& arguments, std::ostream& out) {
  const ParsedArguments parsed = parse_arguments(find_command("info"), arguments);
  const Config config = load_config(parsed.config(), parsed.overrides);
  ModelSpec spec = build_model_spec(config);  // declares buffers only: nothing is allocated
  const OptimizerDecl optimizer = apply_optimizer(spec, config);
  const ModelDims& m = spec.dims;

  out << "model " << config.model_name << " (" << decoder_block_name(config.decoder_block) << "): " << m.L
      << " layers, width " << m.D << ", " << m.H << " query / " << m.K << " kv heads x " << m.d << ", mlp "
      << m.F << ", vocab " << m.V_valid << " (" << m.V << " rows allocated), "
      << (config.logits_via_embedding ? "tied" : "untied") << " unembedding\n";
  out << "segments: " << segments_text(decoder_segments(config)) << "\n";
  std::map<std::string, int64_t> by_component;
  for (const ParameterDecl& parameter : spec.parameters) {
    by_component[parameter.component] += spec.buffer(parameter.value).shape.elements();
  }
  out << "parameters: " << spec.parameter_count() << "\n";
  const EngramCounts engram = engram_counts(spec);
  if (config.num_experts > 0 || engram.layers > 0) {
    // A token passes num_experts_per_tok of each MoE layer's routed experts and reads H (N - 1) rows of
    // each Engram layer's tables; every other tensor it uses whole.
    int64_t activated = 0;
    for (const ParameterDecl& parameter : spec.parameters) {
      const int64_t count = spec.buffer(parameter.value).shape.elements();
      const bool routed = parameter.canonical_name.find("/moe/routed_experts/") != std::string::npos;
      if (is_engram_table(parameter)) {
        activated += engram.rows_per_token * config.engram_head_dim;
      } else {
        activated += routed ? count / config.num_experts * config.num_experts_per_tok : count;
      }
    }
    out << "activated parameters per token: " << activated << " (";
    if (config.num_experts > 0) {
      out << config.num_experts_per_tok << " of " << config.num_experts << " routed experts in each of "
          << spec.moe_layers.size() << " MoE layers" << (engram.layers > 0 ? "; " : "");
    }
    if (engram.layers > 0) out << engram.rows_per_token << " table rows of each Engram layer";
    out << ")\n";
  }
  if (engram.layers > 0) {
    // The tables with what training keeps beside them: gradient and both Adam moments (and a float32
    // master copy when weights are stored narrower).
    int64_t table_bytes = 0;
    for (size_t p = 0; p < spec.parameters.size(); ++p) {
      const ParameterDecl& parameter = spec.parameters[p];
      if (!is_engram_table(parameter)) continue;
      const ParameterState& state = optimizer.state(p);
      std::vector<BufferId> ids = {parameter.value, parameter.gradient};
      ids.insert(ids.end(), state.moments.begin(), state.moments.end());
      if (state.master != kNoBuffer) ids.push_back(state.master);
      for (BufferId id : ids)
        table_bytes +=
            spec.buffer(id).shape.elements() * static_cast<int64_t>(dtype_bytes(spec.buffer(id).dtype));
    }
    std::string layers;
    for (const EngramLayerSpec& layer : spec.engram)
      layers += (layers.empty() ? "" : ", ") + std::to_string(layer.layer);
    char text[400];
    std::snprintf(
        text, sizeof text,
        "engram: %lld layers (%s), %lld hash tables of %lld rows together x %lld: %lld table parameters "
        "(rows padded to 128), %.2f GiB with gradient and Adam moments; forward %.4f TFLOPs per step "
        "(engram.md section 8)\n",
        static_cast<long long>(engram.layers), layers.c_str(), static_cast<long long>(engram.tables),
        static_cast<long long>(engram.rows), static_cast<long long>(config.engram_head_dim),
        static_cast<long long>(engram.table_parameters), static_cast<double>(table_bytes) / (1 << 30),
        engram.forward_flops * static_cast<double>(config.gradient_accumulation_steps) / 1e12);
    out << text;
  }
  if (m.G > 1) {
    out << "mhc: " << m.G << " residual streams, " << 2 * m.L << " sites (attention and MLP of every layer), "
        << config.sinkhorn_iterations << " Sinkhorn iterations\n";
  }
  for (const auto& [component, count] : by_component) {
    char line[96];
    std::snprintf(line, sizeof line, "  %-12s %15lld\n", component.c_str(), static_cast<long long>(count));
    out << line;
  }
  if (m.V != m.V_valid) {
    out << "  (includes " << (m.V - m.V_valid) * m.D
        << " padding-row parameters: vocab padded to a multiple of 128)\n";
  }
  out << optimizer_groups_text(spec, optimizer);
  const StandardFlops flops = standard_training_flops(config);
  char line[200];
  std::snprintf(line, sizeof line,
                "training TFLOPs per device per step: %.4f (learnable %.4f + attention %.4f) at "
                "per_device_batch_size=%lld max_target_length=%lld gradient_accumulation_steps=%lld\n",
                flops.total() / 1e12, flops.learnable / 1e12, flops.attention / 1e12,
                static_cast<long long>(config.per_device_batch_size),
                static_cast<long long>(config.max_target_length),
                static_cast<long long>(config.gradient_accumulation_steps));
  out << line;
  out << learning_rate_schedule_table(learning_rate_schedule(config), config.steps);
  return 0;
}

}  // namespace meshtrain
