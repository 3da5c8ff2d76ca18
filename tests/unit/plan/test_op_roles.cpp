// Typed op roles: every op the planner or the engine treats specially carries its role (and parameter),
// and its name (kept for plan files and traces) says the same thing.
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "tiny_plan.h"

namespace meshtrain {
namespace {

// The name prefixes of each special role, as plan files and traces show them.
const std::vector<std::pair<std::string, OpRole>> kRolePrefixes = {
    {"optimizer/step", OpRole::step_counter},
    {"optimizer/grad_norm/", OpRole::grad_norm},
    {"optimizer/clip", OpRole::clip},
    {"optimizer/adamw/", OpRole::adamw},
    {"optimizer/zero_gradients", OpRole::zero_gradients},
    {"optimizer/reduce_valid_count/", OpRole::reduce_valid_count},
    {"optimizer/reduce_grad_norm/", OpRole::reduce_grad_norm},
    {"tensor/all_reduce/", OpRole::tensor_gradient_reduction},
    {"tensor/kv_replicas_all_reduce/", OpRole::kv_replica_reduction},
    {"data/all_reduce/", OpRole::data_gradient_reduction},
    {"zero1/reduce_scatter/", OpRole::zero1_reduce_scatter},
    {"zero1/slice/", OpRole::zero1_slice},
    {"zero1/gather/", OpRole::zero1_all_gather},
    {"fsdp/gather/", OpRole::fsdp_gather},
    {"fsdp/zero/", OpRole::fsdp_zero},
    {"fsdp/reduce_scatter/", OpRole::fsdp_reduce_scatter},
};

OpRole role_by_name(const std::string& name) {
  for (const auto& [prefix, role] : kRolePrefixes) {
    if (name.starts_with(prefix)) return role;
  }
  return OpRole::model;
}

// Checks every op of every kernel; returns the roles seen.
std::set<OpRole> check_roles(const TrainingPlan& plan) {
  std::set<OpRole> seen;
  for (const KernelPlan& kernel : plan.kernels) {
    for (const PlanOp& op : kernel.ops) {
      const OpDecl& decl = *op.op;
      seen.insert(decl.role);
      EXPECT_EQ(decl.role, role_by_name(decl.name)) << decl.name;
      const bool per_parameter = decl.role != OpRole::model && decl.role != OpRole::step_counter &&
                                 decl.role != OpRole::clip && decl.role != OpRole::zero_gradients &&
                                 decl.role != OpRole::reduce_valid_count &&
                                 decl.role != OpRole::reduce_grad_norm;
      if (!per_parameter) {
        EXPECT_EQ(decl.parameter, -1) << decl.name;
        continue;
      }
      const bool in_range =
          decl.parameter >= 0 && static_cast<size_t>(decl.parameter) < plan.spec.parameters.size();
      EXPECT_TRUE(in_range) << decl.name << " has parameter " << decl.parameter;
      if (!in_range) continue;
      const std::string& parameter = plan.spec.parameters[static_cast<size_t>(decl.parameter)].canonical_name;
      EXPECT_TRUE(decl.name.ends_with("/" + parameter) || decl.name.ends_with("/" + parameter + "#backward"))
          << decl.name << " tagged with " << parameter;
    }
  }
  return seen;
}

TEST(OpRoles, EverySpecialOpCarriesItsRoleAndParameter) {
  // Data with ZeRO-1 (contiguous and strided shards) and kv heads replicated over tensor.
  const std::set<OpRole> zero1 =
      check_roles(testing::tiny_plan({"mesh.data=2", "mesh.tensor=4", "shard_optimizer_over_data=true"}));
  // Plain data parallelism, FSDP and tensor-partial gradients (QK-norm scales).
  const std::set<OpRole> fsdp =
      check_roles(testing::tiny_plan({"mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2"}));
  std::set<OpRole> seen = zero1;
  seen.insert(fsdp.begin(), fsdp.end());
  for (const auto& [prefix, role] : kRolePrefixes)
    EXPECT_TRUE(seen.count(role)) << prefix << " never planned";
}

TEST(OpRoles, OptimizerUpdateOpsNameTheirParameter) {
  const TrainingPlan plan = testing::tiny_plan();
  size_t norms = 0, adamws = 0;
  for (const OpDecl& op : plan.optimizer.update) {
    if (op.role == OpRole::grad_norm) ++norms;
    if (op.role == OpRole::adamw) ++adamws;
    if (op.parameter >= 0) {
      const ParameterDecl& parameter = plan.spec.parameters[static_cast<size_t>(op.parameter)];
      EXPECT_NE(std::find(op.reads.begin(), op.reads.end(), parameter.gradient), op.reads.end()) << op.name;
    }
  }
  EXPECT_EQ(norms, plan.spec.parameters.size());
  EXPECT_EQ(adamws, plan.spec.parameters.size());
}

}  // namespace
}  // namespace meshtrain
