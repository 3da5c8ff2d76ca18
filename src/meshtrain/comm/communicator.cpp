// The backend-independent half of a communicator: argument checks, byte counters (aot-plan.md
// definitions), the flag and hash helpers, the mesh split, and the one-process backend.
#include "meshtrain/comm/communicator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "meshtrain/core/error.h"

namespace meshtrain {

size_t comm_element_bytes(CommElement element) {
  switch (element) {
    case CommElement::f32:
    case CommElement::i32:
      return 4;
    case CommElement::bf16:
      return 2;
    case CommElement::u8:
      return 1;
    case CommElement::f64:
    case CommElement::i64:
      return 8;
  }
  return 0;
}

std::string comm_element_name(CommElement element) {
  switch (element) {
    case CommElement::f32:
      return "f32";
    case CommElement::bf16:
      return "bf16";
    case CommElement::i32:
      return "i32";
    case CommElement::u8:
      return "u8";
    case CommElement::f64:
      return "f64";
    case CommElement::i64:
      return "i64";
  }
  return "?";
}

CommElement comm_element_of(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CommElement::f32;
    case DType::bf16:
      return CommElement::bf16;
    case DType::i32:
      return CommElement::i32;
    case DType::u8:
      return CommElement::u8;
  }
  return CommElement::u8;
}

std::string comm_call_name(CommCall call) {
  switch (call) {
    case CommCall::all_reduce:
      return "all_reduce";
    case CommCall::all_gather:
      return "all_gather";
    case CommCall::reduce_scatter:
      return "reduce_scatter";
    case CommCall::all_to_all:
      return "all_to_all";
    case CommCall::send:
      return "send";
    case CommCall::recv:
      return "recv";
    case CommCall::barrier:
      return "barrier";
  }
  return "?";
}

double CommunicatorStats::total_bytes() const {
  double total = 0.0;
  for (int call = 0; call < kCommCallCount; ++call) {
    if (static_cast<CommCall>(call) != CommCall::recv) total += by_call[static_cast<size_t>(call)].bytes;
  }
  return total;
}

int64_t CommunicatorStats::total_calls() const {
  int64_t total = 0;
  for (const CommCallStats& call : by_call) total += call.calls;
  return total;
}

Communicator::Communicator(int rank, int size, std::vector<int> world_ranks, std::string axis_name,
                           double collective_timeout_s, std::shared_ptr<std::string> context)
    : rank_(rank),
      size_(size),
      world_ranks_(std::move(world_ranks)),
      axis_name_(std::move(axis_name)),
      collective_timeout_s_(collective_timeout_s),
      context_(std::move(context)) {
  MT_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, "rank " + to_text(rank_) + " of " + to_text(size_));
  MT_CHECK(static_cast<int>(world_ranks_.size()) == size_, "one world rank per group rank");
  if (!(collective_timeout_s_ > 0.0)) {
    fail("collective_timeout_s", "a positive number of seconds", to_text(collective_timeout_s_),
         "set collective_timeout_s=300 (or more for very large models)");
  }
}

void Communicator::set_context(std::string step_label) {
  *context_ = std::move(step_label);
}

std::unique_ptr<CollectiveRequest> Communicator::count_and_start(Call call, double bytes) {
  CommCallStats& counter = stats_[call.kind];
  counter.calls += 1;
  counter.bytes += bytes;
  return start(call);
}

namespace {

// Payload bytes x (n-1)/n: what leaves a rank of a group of n in a ring or tree (aot-plan.md).
double share_leaving(int64_t bytes, int group_size) {
  const double n = static_cast<double>(group_size);
  return static_cast<double>(bytes) * (n - 1.0) / n;
}

void check_same_element(const CommBuffer& a, const CommBuffer& b, const std::string& name) {
  MT_CHECK(a.element == b.element,
           name + ": " + comm_element_name(a.element) + " vs " + comm_element_name(b.element));
}

}  // namespace

std::unique_ptr<CollectiveRequest> Communicator::all_reduce_start(CommBuffer buffer, ReduceOp op,
                                                                  std::string_view name) {
  MT_CHECK(buffer.count >= 0, std::string(name));
  return count_and_start({CommCall::all_reduce, buffer, buffer, op, -1, std::string(name)},
                         2.0 * share_leaving(buffer.bytes(), size_));
}

std::unique_ptr<CollectiveRequest> Communicator::all_gather_start(CommBuffer shard, CommBuffer full,
                                                                  std::string_view name) {
  const std::string label(name);
  check_same_element(shard, full, label);
  MT_CHECK(full.count == shard.count * size_, label + ": full " + to_text(full.count) + " elements, shard " +
                                                  to_text(shard.count) + " x " + to_text(size_) + " ranks");
  return count_and_start({CommCall::all_gather, shard, full, ReduceOp::sum, -1, label},
                         share_leaving(full.bytes(), size_));
}

std::unique_ptr<CollectiveRequest> Communicator::reduce_scatter_start(CommBuffer full, CommBuffer shard,
                                                                      ReduceOp op, std::string_view name) {
  const std::string label(name);
  check_same_element(shard, full, label);
  MT_CHECK(full.count == shard.count * size_, label + ": full " + to_text(full.count) + " elements, shard " +
                                                  to_text(shard.count) + " x " + to_text(size_) + " ranks");
  const auto* full_begin = static_cast<const uint8_t*>(full.data);
  const auto* shard_begin = static_cast<const uint8_t*>(shard.data);
  MT_CHECK(shard.count == 0 || shard_begin + shard.bytes() <= full_begin ||
               full_begin + full.bytes() <= shard_begin,
           label + ": reduce_scatter needs a shard buffer outside the full buffer");
  return count_and_start({CommCall::reduce_scatter, full, shard, op, -1, label},
                         share_leaving(full.bytes(), size_));
}

std::unique_ptr<CollectiveRequest> Communicator::all_to_all_start(CommBuffer input, CommBuffer output,
                                                                  std::string_view name) {
  const std::string label(name);
  check_same_element(input, output, label);
  MT_CHECK(input.count == output.count && input.count % size_ == 0,
           label + ": input " + to_text(input.count) + ", output " + to_text(output.count) +
               " elements, must be equal and divisible by " + to_text(size_) + " ranks");
  MT_CHECK(input.data != output.data || input.count == 0, label + ": all_to_all is not in place");
  return count_and_start({CommCall::all_to_all, input, output, ReduceOp::sum, -1, label},
                         share_leaving(input.bytes(), size_));
}

std::unique_ptr<CollectiveRequest> Communicator::send_start(CommBuffer buffer, int peer,
                                                            std::string_view name) {
  MT_CHECK(peer >= 0 && peer < size_, std::string(name) + ": peer " + to_text(peer));
  // A message to itself never leaves the rank.
  const double bytes = peer == rank_ ? 0.0 : static_cast<double>(buffer.bytes());
  return count_and_start({CommCall::send, buffer, {}, ReduceOp::sum, peer, std::string(name)}, bytes);
}

std::unique_ptr<CollectiveRequest> Communicator::recv_start(CommBuffer buffer, int peer,
                                                            std::string_view name) {
  MT_CHECK(peer >= 0 && peer < size_, std::string(name) + ": peer " + to_text(peer));
  const double bytes = peer == rank_ ? 0.0 : static_cast<double>(buffer.bytes());
  return count_and_start({CommCall::recv, {}, buffer, ReduceOp::sum, peer, std::string(name)}, bytes);
}

std::unique_ptr<CollectiveRequest> Communicator::barrier_start(std::string_view name) {
  return count_and_start({CommCall::barrier, {}, {}, ReduceOp::sum, -1, std::string(name)}, 0.0);
}

void Communicator::all_reduce(CommBuffer buffer, ReduceOp op, std::string_view name) {
  all_reduce_start(buffer, op, name)->wait();
}
void Communicator::all_gather(CommBuffer shard, CommBuffer full, std::string_view name) {
  all_gather_start(shard, full, name)->wait();
}
void Communicator::reduce_scatter(CommBuffer full, CommBuffer shard, ReduceOp op, std::string_view name) {
  reduce_scatter_start(full, shard, op, name)->wait();
}
void Communicator::all_to_all(CommBuffer input, CommBuffer output, std::string_view name) {
  all_to_all_start(input, output, name)->wait();
}
void Communicator::send(CommBuffer buffer, int peer, std::string_view name) {
  send_start(buffer, peer, name)->wait();
}
void Communicator::recv(CommBuffer buffer, int peer, std::string_view name) {
  recv_start(buffer, peer, name)->wait();
}
void Communicator::barrier(std::string_view name) {
  barrier_start(name)->wait();
}

bool Communicator::any_rank_true(bool local_flag, std::string_view name) {
  int32_t flag = local_flag ? 1 : 0;
  all_reduce(comm_buffer(&flag, 1), ReduceOp::max, name);
  return flag != 0;
}

void Communicator::require_same_on_all_ranks(uint64_t hash, const std::string& what) {
  std::vector<int64_t> hashes(static_cast<size_t>(size_));
  int64_t mine = static_cast<int64_t>(hash);
  all_gather(comm_buffer(&mine, 1), comm_buffer(hashes), "check/" + what);
  // Every rank holds every hash, so every rank reaches the same verdict and none is left waiting.
  std::map<int64_t, std::vector<int>> ranks_by_hash;
  for (int group_rank = 0; group_rank < size_; ++group_rank) {
    ranks_by_hash[hashes[static_cast<size_t>(group_rank)]].push_back(world_rank_of(group_rank));
  }
  if (ranks_by_hash.size() == 1) return;
  std::string found;
  char hex[32];
  for (const auto& [value, ranks] : ranks_by_hash) {
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(value));
    found += std::string(found.empty() ? "" : "; ") + (ranks.size() == 1 ? "rank" : "ranks");
    for (size_t i = 0; i < ranks.size(); ++i) found += std::string(i == 0 ? " " : ", ") + to_text(ranks[i]);
    found += " have " + std::string(hex);
  }
  fail(what, "the same " + what + " on every rank of the " + axis_name_ + " group", found,
       "start every rank from the same meshtrain binary and the same config");
}

void agree_on_setup_errors(Communicator& world, std::exception_ptr local_error) {
  if (world.size() == 1) {
    if (local_error) std::rethrow_exception(local_error);
    return;
  }
  int exit_code = 0;
  if (local_error) {
    try {
      std::rethrow_exception(local_error);
    } catch (const MeshError& error) {
      std::fprintf(stderr, "meshtrain: error (rank %d): %s\n", world.rank(), error.what());
      exit_code = 1;
    } catch (const std::exception& error) {
      std::fprintf(stderr, "meshtrain: internal error (rank %d, please report it): %s\n", world.rank(),
                   error.what());
      exit_code = 3;
    }
    std::fflush(stderr);
  }
  // [failed ranks, lowest failed rank as size - rank, exit code]: every rank reaches the same verdict.
  std::vector<int64_t> failed = {exit_code != 0 ? 1 : 0, exit_code != 0 ? world.size() - world.rank() : 0};
  int64_t worst_exit_code = exit_code;
  world.all_reduce(comm_buffer(&failed[0], 1), ReduceOp::sum, "setup/failed_ranks");
  world.all_reduce(comm_buffer(&failed[1], 1), ReduceOp::max, "setup/first_failed_rank");
  world.all_reduce(comm_buffer(&worst_exit_code, 1), ReduceOp::max, "setup/exit_code");
  if (failed[0] == 0) return;
  if (exit_code == 0) {
    std::fprintf(stderr,
                 "meshtrain: error (rank %d): stopping: %lld of %d ranks failed during set-up (rank %lld's "
                 "message is above)\n",
                 world.rank(), static_cast<long long>(failed[0]), world.size(),
                 static_cast<long long>(world.size() - failed[1]));
    std::fflush(stderr);
  }
  throw AlreadyReported{static_cast<int>(worst_exit_code)};
}

// The one-process backend.

namespace {

class CompletedRequest : public CollectiveRequest {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// A recv from itself completes when the matching send has been queued.
class LocalReceive : public CollectiveRequest {
 public:
  LocalReceive(std::vector<std::vector<uint8_t>>& queue, CommBuffer buffer, std::string name)
      : queue_(queue), buffer_(buffer), name_(std::move(name)) {}
  ~LocalReceive() override {
    if (!done_) wait();
  }
  bool test() override {
    if (done_ || queue_.empty()) return done_;
    std::vector<uint8_t> message = std::move(queue_.front());
    queue_.erase(queue_.begin());
    MT_CHECK(static_cast<int64_t>(message.size()) == buffer_.bytes(),
             name_ + ": recv of " + to_text(buffer_.bytes()) + " bytes got " + to_text(message.size()));
    if (!message.empty()) std::memcpy(buffer_.data, message.data(), message.size());
    done_ = true;
    return true;
  }
  void wait() override {
    // One process cannot send while it waits: nothing queued now means nothing ever arrives.
    MT_CHECK(test(), name_ + ": recv from this rank itself with no send before it");
  }

 private:
  std::vector<std::vector<uint8_t>>& queue_;
  CommBuffer buffer_;
  std::string name_;
  bool done_ = false;
};

void copy_buffer(const CommBuffer& from, const CommBuffer& to) {
  if (from.data != to.data && from.count > 0)
    std::memcpy(to.data, from.data, static_cast<size_t>(from.bytes()));
}

}  // namespace

LocalCommunicator::LocalCommunicator(std::string axis_name, std::shared_ptr<std::string> context)
    : Communicator(0, 1, {0}, std::move(axis_name), 300.0, std::move(context)) {}

std::unique_ptr<Communicator> LocalCommunicator::split(int /*color*/, int /*key*/,
                                                       const std::string& axis_name) {
  return std::make_unique<LocalCommunicator>(axis_name, shared_context());
}

void LocalCommunicator::abort_all_ranks(int exit_code) {
  std::exit(exit_code);
}

std::unique_ptr<CollectiveRequest> LocalCommunicator::start(const Call& call) {
  switch (call.kind) {
    case CommCall::all_gather:
    case CommCall::reduce_scatter:
    case CommCall::all_to_all:
      copy_buffer(call.input, call.output);  // one rank: the full buffer is the shard
      break;
    case CommCall::send: {
      const auto* bytes = static_cast<const uint8_t*>(call.input.data);
      messages_to_self_.emplace_back(bytes, bytes + call.input.bytes());
      break;
    }
    case CommCall::recv:
      return std::make_unique<LocalReceive>(messages_to_self_, call.output, call.name);
    case CommCall::all_reduce:
    case CommCall::barrier:
      break;
  }
  return std::make_unique<CompletedRequest>();
}

// The mesh.

MeshCommunicators make_mesh_communicators(Communicator& world, const Mesh& mesh) {
  if (mesh.devices() != world.size()) {
    std::string degrees;
    for (MeshAxis axis : listed_mesh_axes(mesh))
      degrees +=
          (degrees.empty() ? "" : " x ") + std::string(mesh_axis_name(axis)) + "=" + to_text(mesh.size(axis));
    fail("mesh", "mesh degrees >= 1 whose product is the number of ranks (" + to_text(world.size()) + ")",
         degrees,
         "set mesh.data=-1 to fill the data axis from the number of ranks, or start " +
             to_text(mesh.devices()) + " ranks");
  }
  MeshCommunicators communicators;
  for (MeshAxis axis : kMeshAxes) {
    const MeshGroup group = mesh_group(mesh, world.rank(), axis);
    communicators.at(axis) =
        world.split(static_cast<int>(group.colour), static_cast<int>(group.index), mesh_axis_name(axis));
  }
  return communicators;
}

bool started_by_mpi_launcher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

std::unique_ptr<Communicator> make_world_communicator(double collective_timeout_s) {
  if (started_by_mpi_launcher()) return make_mpi_world_communicator(collective_timeout_s);
  // srun without an MPI plugin starts its tasks with nothing to connect them: each would train alone and
  // write the same run_dir.
  const char* step_tasks = std::getenv("SLURM_STEP_NUM_TASKS");
  if (step_tasks != nullptr && std::atoll(step_tasks) > 1) {
    fail("SLURM_STEP_NUM_TASKS", "an MPI launcher for the " + std::string(step_tasks) + " tasks srun started",
         "no MPI in this task's environment (neither PMIX_RANK nor OMPI_COMM_WORLD_SIZE is set)",
         "start the tasks with srun --mpi=pmix (or mpirun inside the allocation; `meshtrain launch` writes "
         "either)");
  }
  if (!(collective_timeout_s > 0.0)) {
    fail("collective_timeout_s", "a positive number of seconds", to_text(collective_timeout_s),
         "set collective_timeout_s=300 (or more for very large models)");
  }
  return std::make_unique<LocalCommunicator>();
}

}  // namespace meshtrain
