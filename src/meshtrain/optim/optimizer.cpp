// The optimizer pass (see optimizer.h): state, then the update kernel's ops. Gradients hold sums over the
// global batch until the update; one scale applies the 1/valid-count and the clip.
// GCC 12 at -O1 (the sanitizer build) reports std::regex's internals as maybe-uninitialized (a false
// positive, GCC bug 105562); warnings are errors, so that one warning is off in this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "meshtrain/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <regex>
#include <tuple>

#include "meshtrain/core/error.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/muon.h"

namespace meshtrain {
namespace {

BufferId declare(ModelSpec& spec, BufferDecl buffer) {
  spec.buffers.push_back(std::move(buffer));
  return static_cast<BufferId>(spec.buffers.size() - 1);
}

// optimizer/step: the 1-based step the update writes for the optimizer's state (kept apart from it).
OpDecl step_counter_op(BufferId counter) {
  OpDecl op{"optimizer/step",
            {counter},
            {counter},
            0.0,
            [=](const OpContext& context) {
              const auto step = static_cast<int32_t>(context.update->step + 1);
              context.kernels->memory_copy_in(context.i32(counter), &step, sizeof step);
            },
            OpKind::optimizer};
  op.role = OpRole::step_counter;
  return op;
}

// optimizer/grad_norm/<parameter>: each layer's squared norm into its own slot (a stacked gradient, and any
// shard of it, is its layers' blocks one after another).
OpDecl grad_norm_op(const ModelSpec& spec, size_t k) {
  const ParameterDecl& parameter = spec.parameters[k];
  const BufferId gradient = parameter.gradient;
  const int64_t count = spec.buffer(gradient).shape.elements();
  std::vector<int32_t> slots = {parameter.norm_slot};
  if (parameter.stacked()) {
    slots.clear();
    for (const ParameterDecl::Member& member : parameter.members) slots.push_back(member.norm_slot);
  }
  OpDecl op{"optimizer/grad_norm/" + parameter.canonical_name,
            {gradient},
            {},
            2.0 * static_cast<double>(count),
            [=](const OpContext& context) {
              // Sizes come from the views: under FSDP or ZeRO-1 the plan binds these ops to shards.
              const TensorView view = context.view(gradient);
              const int64_t block = view.elements() / static_cast<int64_t>(slots.size());
              for (size_t i = 0; i < slots.size(); ++i) {
                context.update->norm_slots.at(static_cast<size_t>(slots[i])) +=
                    context.share *
                    context.kernels->sum_of_squares(view.f32() + static_cast<int64_t>(i) * block, block);
              }
            },
            OpKind::optimizer};
  op.role = OpRole::grad_norm;
  op.parameter = static_cast<int32_t>(k);
  return op;
}

// optimizer/clip: the global norm, the scale of every gradient, and whether the step is skipped.
OpDecl clip_op(double threshold) {
  OpDecl op{"optimizer/clip",
            {},
            {},
            0.0,
            [=](const OpContext& context) {
              UpdateState& u = *context.update;
              u.fold_norm_slots();
              // With no valid target the gradient is zero: the step still decays weights and advances the
              // moments.
              const double token_scale =
                  u.global_valid_count > 0 ? 1.0 / static_cast<double>(u.global_valid_count) : 0.0;
              u.raw_grad_norm = std::sqrt(u.sum_of_squares) * token_scale;
              // The squared norm is summed over every rank's shard (or the gradients were reduced before
              // it), so every rank sees a NaN of any rank here.
              u.nonfinite = !std::isfinite(u.sum_of_squares);
              double clip = 1.0;
              if (threshold > 0.0 && u.raw_grad_norm > threshold) clip = threshold / u.raw_grad_norm;
              u.grad_norm = u.raw_grad_norm * clip;
              u.gradient_scale = token_scale * clip;
            },
            OpKind::optimizer};
  op.role = OpRole::clip;
  return op;
}

// Whether `spec` holds every layer with the embedding and the head (not a pipeline stage's chunk).
bool holds_whole_model(const ModelSpec& spec) {
  const LayerChunk& chunk = spec.chunks.front().layers;
  return spec.chunks.size() == 1 && chunk.first_layer == 0 && chunk.last_layer == spec.dims.L - 1 &&
         chunk.with_embedding && chunk.with_head;
}

// "0-3,5": sorted layer indices as ranges.
std::string layer_ranges(const std::vector<int64_t>& layers) {
  std::string text;
  for (size_t i = 0; i < layers.size();) {
    size_t last = i;
    while (last + 1 < layers.size() && layers[last + 1] == layers[last] + 1) ++last;
    text += (text.empty() ? "" : ",") + std::to_string(layers[i]) +
            (last > i ? "-" + std::to_string(layers[last]) : "");
    i = last + 1;
  }
  return text;
}

// `names` with the layers of one name folded: "decoder/layers_{0-3}/mlp/wo/kernel", in first-seen order.
std::string folded_names(const std::vector<std::string>& names) {
  static const std::regex layer_index("layers_([0-9]+)/");
  std::vector<std::string> order;
  std::map<std::string, std::vector<int64_t>> layers_of;  // name with "{}" for the index -> indices
  for (const std::string& name : names) {
    std::smatch match;
    std::string key = name;
    if (std::regex_search(name, match, layer_index))
      key = match.prefix().str() + "layers_{}/" + match.suffix().str();
    if (!layers_of.contains(key)) order.push_back(key);
    if (!match.empty()) layers_of[key].push_back(std::stoll(match[1].str()));
    layers_of.try_emplace(key);
  }
  std::string text;
  for (const std::string& key : order) {
    std::vector<int64_t>& layers = layers_of[key];
    std::sort(layers.begin(), layers.end());
    std::string name = key;
    const size_t brace = name.find("{}");
    if (brace != std::string::npos) {
      const std::string ranges = layer_ranges(layers);
      name.replace(brace, 2, layers.size() > 1 ? "{" + ranges + "}" : ranges);
    }
    text += (text.empty() ? "" : ", ") + name;
  }
  return text;
}

}  // namespace

std::string optimizer_groups_text(const ModelSpec& spec, const OptimizerDecl& optimizer) {
  struct Row {
    size_t group;
    std::string optimizer;
    bool decay;
    std::vector<std::string> names;
  };
  std::vector<Row> rows;
  const auto add = [&](size_t group, const std::string& step, const std::string& name, bool decay) {
    for (Row& row : rows) {
      if (row.group == group && row.optimizer == step && row.decay == decay) {
        row.names.push_back(name);
        return;
      }
    }
    rows.push_back({group, step, decay, {name}});
  };
  for (size_t p = 0; p < spec.parameters.size(); ++p) {
    const ParameterDecl& parameter = spec.parameters[p];
    const ParameterState& state = optimizer.state(p);
    const std::string step = state.muon ? "muon" : "adamw";
    if (!parameter.stacked()) add(state.group, step, parameter.canonical_name, state.weight_decay.at(0));
    for (size_t i = 0; i < parameter.members.size(); ++i)
      add(state.group, step, parameter.members[i].canonical_name, state.weight_decay.at(i));
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    // Group by group; within one, the decayed tensors first.
    return std::make_tuple(a.group, a.optimizer, !a.decay) < std::make_tuple(b.group, b.optimizer, !b.decay);
  });
  std::string text = "optimizer groups:\n";
  for (const Row& row : rows) {
    const ParameterGroup& group = optimizer.groups[row.group];
    char head[200];
    std::snprintf(head, sizeof head, "  %s, %s, lr x%g, %s (%zu tensors): ", group.name.c_str(),
                  row.optimizer.c_str(), group.learning_rate_multiplier,
                  row.decay ? ("decay " + to_text(row.optimizer == "muon" ? group.muon_weight_decay_rate
                                                                          : group.weight_decay_rate))
                                  .c_str()
                            : "no decay",
                  row.names.size());
    text += head + folded_names(row.names) + "\n";
  }
  return text;
}

std::vector<std::string> optimizer_moment_names(const Config& config) {
  return config.opt_type == OptimizerType::muon ? every_moment_name() : adamw_moment_names();
}

std::vector<std::string> every_moment_name() {
  std::vector<std::string> names = adamw_moment_names();
  for (const std::string& name : muon_moment_names()) names.push_back(name);
  return names;
}

std::vector<std::string> parameter_moment_names(const Config& config, const ParameterDecl& parameter) {
  const std::vector<ParameterGroup> groups = parameter_groups(config);
  return steps_with_muon(groups[group_of(groups, parameter)], parameter) ? muon_moment_names()
                                                                         : adamw_moment_names();
}

OptimizerDecl apply_optimizer(ModelSpec& spec, const Config& config) {
  MT_CHECK(!spec.decoding(), "an optimizer applied to a decode spec");
  for (const BufferDecl& buffer : spec.buffers) {
    MT_CHECK(buffer.kind != BufferKind::optimizer_state && buffer.kind != BufferKind::step_counter,
             "the optimizer applied twice to one spec: " + buffer.name);
  }
  if (!config.adamw_mask.empty() || !config.adamw_mask_include.empty()) {
    // The patterns are the whole model's: a pipeline stage's chunk checks them against every stage's names.
    check_decay_patterns(config,
                         canonical_tensor_names(holds_whole_model(spec) ? spec : build_model_spec(config)));
  }
  OptimizerDecl optimizer;
  optimizer.moment_names = optimizer_moment_names(config);
  optimizer.groups = parameter_groups(config);
  for (const ParameterDecl& parameter : spec.parameters) {
    ParameterState state;
    state.group = group_of(optimizer.groups, parameter);
    state.muon = steps_with_muon(optimizer.groups[state.group], parameter);
    optimizer.parameters.push_back(std::move(state));
  }
  if (config.opt_type == OptimizerType::muon &&
      std::none_of(optimizer.parameters.begin(), optimizer.parameters.end(),
                   [](const ParameterState& state) { return state.muon; })) {
    fail("config key 'opt_type'", "a model with hidden weight matrices for Muon to step",
         "muon on a model (or a pipeline stage's chunk) without one",
         "set opt_type=adamw: Muon steps attention, MLA, MLP and expert matrices only");
  }
  // The state after every buffer of the model, parameter by parameter, at the value's (stacked) shape.
  int64_t muon_scratch_floats = 0;
  for (size_t k = 0; k < spec.parameters.size(); ++k) {
    const ParameterDecl& parameter = spec.parameters[k];
    ParameterState& state = optimizer.parameters[k];
    const ParameterGroup& group = optimizer.groups[state.group];
    if (!parameter.stacked())
      state.weight_decay.push_back(decays(group, parameter, parameter.canonical_name));
    for (const ParameterDecl::Member& member : parameter.members)
      state.weight_decay.push_back(decays(group, parameter, member.canonical_name));
    const std::string name = spec.buffer(parameter.value).name;  // a copy: declare() grows the buffer list
    const Shape shape = spec.buffer(parameter.value).shape;
    state.moment_names = state.muon ? muon_moment_names() : adamw_moment_names();
    for (const std::string& moment : state.moment_names) {
      state.moments.push_back(
          declare(spec, {moment + "/" + name, BufferKind::optimizer_state, config.mu_dtype, shape}));
    }
    if (config.weight_dtype != config.mu_dtype)
      state.master = declare(spec, {"master/" + name, BufferKind::optimizer_state, config.mu_dtype, shape});
    if (state.muon) {
      const MuonMatrices matrices = muon_matrices(spec, parameter);
      muon_scratch_floats =
          std::max(muon_scratch_floats, spec.kernels->muon_scratch_floats(matrices.rows, matrices.cols));
    }
  }
  optimizer.step_counter =
      declare(spec, {"optimizer/step", BufferKind::step_counter, DType::i32, shape_of({{"step", 1}})});
  if (muon_scratch_floats > 0) {
    optimizer.muon_scratch = declare(spec, {"optimizer/muon_scratch", BufferKind::scratch, DType::f32,
                                            shape_of({{"muon_scratch", muon_scratch_floats}})});
  }

  optimizer.update.push_back(step_counter_op(optimizer.step_counter));
  for (size_t k = 0; k < spec.parameters.size(); ++k) optimizer.update.push_back(grad_norm_op(spec, k));
  optimizer.update.push_back(clip_op(config.gradient_clipping_threshold));
  for (size_t k = 0; k < spec.parameters.size(); ++k) {
    const ParameterState& state = optimizer.parameters[k];
    const ParameterGroup& group = optimizer.groups[state.group];
    optimizer.update.push_back(state.muon
                                   ? muon_step_op(spec, config, k, state, group, optimizer.muon_scratch)
                                   : adamw_step_op(spec, config, k, state, group));
  }
  return optimizer;
}

}  // namespace meshtrain
