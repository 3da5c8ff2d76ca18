// Communicators: collectives over a group of ranks (the world, or one mesh axis), with per-call byte
// counters that use the plan's definitions (aot-plan.md) and a timeout that names the ranks that did not
// arrive. Backends: LocalCommunicator (one process, no launcher) and MPI (OpenMPI, started by mpirun).
//
// Rules every caller follows (as with MPI): all ranks of a group issue the same collectives in the same
// order with the same element counts; a communicator is used from one thread; buffers of a non-blocking
// call are not touched until its request completed; a communicator outlives its requests.
#pragma once

#include <array>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "meshtrain/core/dtype.h"
#include "meshtrain/core/tensor.h"
#include "meshtrain/mesh/mesh.h"

namespace meshtrain {

// What a collective moves: the engine's DTypes plus the 64-bit scalars of loss sums, token counts and
// squared norms (summing those in f32 or i32 would round or overflow at scale).
enum class CommElement { f32, bf16, i32, u8, f64, i64 };
size_t comm_element_bytes(CommElement element);
std::string comm_element_name(CommElement element);  // "f32", "bf16", ...
CommElement comm_element_of(DType dtype);

template <class T>
constexpr CommElement comm_element_of_type();
template <>
constexpr CommElement comm_element_of_type<float>() {
  return CommElement::f32;
}
template <>
constexpr CommElement comm_element_of_type<double>() {
  return CommElement::f64;
}
template <>
constexpr CommElement comm_element_of_type<int32_t>() {
  return CommElement::i32;
}
template <>
constexpr CommElement comm_element_of_type<int64_t>() {
  return CommElement::i64;
}
template <>
constexpr CommElement comm_element_of_type<uint8_t>() {
  return CommElement::u8;
}

// A contiguous buffer: first element, element count, element type. Input buffers are only read.
struct CommBuffer {
  void* data = nullptr;
  int64_t count = 0;
  CommElement element = CommElement::f32;

  int64_t bytes() const { return count * static_cast<int64_t>(comm_element_bytes(element)); }
};

template <class T>
CommBuffer comm_buffer(std::span<T> values) {
  return {const_cast<std::remove_const_t<T>*>(values.data()), static_cast<int64_t>(values.size()),
          comm_element_of_type<std::remove_const_t<T>>()};
}
template <class T>
CommBuffer comm_buffer(std::vector<T>& values) {
  return comm_buffer(std::span<T>(values));
}
template <class T>
CommBuffer comm_buffer(const std::vector<T>& values) {
  return comm_buffer(std::span<const T>(values));
}
template <class T>
CommBuffer comm_buffer(T* data, int64_t count) {  // comm_buffer(&loss_sum, 1) for a scalar
  return comm_buffer(std::span<T>(data, static_cast<size_t>(count)));
}
inline CommBuffer comm_buffer(const TensorView& tensor) {
  return {tensor.data, tensor.elements(), comm_element_of(tensor.dtype)};
}

enum class ReduceOp { sum, max };

// The calls a communicator counts.
enum class CommCall { all_reduce, all_gather, reduce_scatter, all_to_all, send, recv, barrier };
inline constexpr int kCommCallCount = 7;
std::string comm_call_name(CommCall call);  // "all_reduce", ...

struct CommCallStats {
  int64_t calls = 0;
  double bytes = 0.0;  // payload bytes per rank, aot-plan.md definitions with n = this group's size
};

struct CommunicatorStats {
  std::array<CommCallStats, kCommCallCount> by_call{};

  const CommCallStats& operator[](CommCall call) const { return by_call[static_cast<size_t>(call)]; }
  CommCallStats& operator[](CommCall call) { return by_call[static_cast<size_t>(call)]; }
  // Every call's bytes except recv: a received message is its sender's send bytes (the plan counts a
  // send/recv pair once per rank, as the bytes it sends).
  double total_bytes() const;
  int64_t total_calls() const;
};

// A started non-blocking call. Destroying one that has not completed waits for it.
class CollectiveRequest {
 public:
  virtual ~CollectiveRequest() = default;
  // Returns once the call completed here; aborts the run (naming the missing ranks) at the timeout.
  virtual void wait() = 0;
  // True once completed. Also drives progress: MPI moves a non-blocking collective only inside MPI calls,
  // so code that overlaps compute with a collective calls test() between kernels.
  virtual bool test() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& axis_name() const { return axis_name_; }  // "world", "data", "fsdp", ...
  int world_rank_of(int group_rank) const { return world_ranks_[static_cast<size_t>(group_rank)]; }
  double collective_timeout_s() const { return collective_timeout_s_; }

  // Where the run is ("step 12"), for failure messages; shared with every communicator split from this one.
  void set_context(std::string step_label);
  const std::string& context() const { return *context_; }
  // The label itself, for a communicator that wraps this one (staged_communicator.h) and shares it.
  std::shared_ptr<std::string> shared_context() const { return context_; }

  // Non-blocking calls; `name` says what moves ("update/grad_norm") in failure messages.
  // all_reduce: in place. all_gather: `shard` of every rank, rank-ordered, into `full` (count = size x
  // shard count; `shard` may be this rank's slot of `full`). reduce_scatter: `full` of every rank reduced,
  // this rank's block into `shard`. all_to_all: block j of `input` goes to rank j, block i of `output`
  // comes from rank i (blocks of count / size elements).
  std::unique_ptr<CollectiveRequest> all_reduce_start(CommBuffer buffer, ReduceOp op, std::string_view name);
  std::unique_ptr<CollectiveRequest> all_gather_start(CommBuffer shard, CommBuffer full,
                                                      std::string_view name);
  std::unique_ptr<CollectiveRequest> reduce_scatter_start(CommBuffer full, CommBuffer shard, ReduceOp op,
                                                          std::string_view name);
  std::unique_ptr<CollectiveRequest> all_to_all_start(CommBuffer input, CommBuffer output,
                                                      std::string_view name);
  std::unique_ptr<CollectiveRequest> send_start(CommBuffer buffer, int peer, std::string_view name);
  std::unique_ptr<CollectiveRequest> recv_start(CommBuffer buffer, int peer, std::string_view name);
  std::unique_ptr<CollectiveRequest> barrier_start(std::string_view name);

  // Blocking calls: the non-blocking call, then wait().
  void all_reduce(CommBuffer buffer, ReduceOp op, std::string_view name);
  void all_gather(CommBuffer shard, CommBuffer full, std::string_view name);
  void reduce_scatter(CommBuffer full, CommBuffer shard, ReduceOp op, std::string_view name);
  void all_to_all(CommBuffer input, CommBuffer output, std::string_view name);
  void send(CommBuffer buffer, int peer, std::string_view name);
  void recv(CommBuffer buffer, int peer, std::string_view name);
  void barrier(std::string_view name);

  // True on every rank when `local_flag` is true on any rank (non-finite loss or gradient on one shard).
  bool any_rank_true(bool local_flag, std::string_view name);
  // Throws MeshError on EVERY rank (all of them see every hash) when the ranks disagree: names `what` and
  // which ranks hold which value. For the binary and config identity at start.
  void require_same_on_all_ranks(uint64_t hash, const std::string& what);

  // A sub-communicator of the ranks that pass the same color, ordered by key (then by rank here); every
  // rank of this group calls it. Guarded by a barrier under the timeout, so a missing rank is named.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& axis_name) = 0;

  // Ends every rank of the job now with `exit_code` (a rank-local error that the others cannot see).
  [[noreturn]] virtual void abort_all_ranks(int exit_code) = 0;

  // This rank's place among the group's ranks that share its host (MPI: MPI_COMM_TYPE_SHARED, what MPI
  // itself knows of the hosts); every rank of the group calls it.
  struct HostRanks {
    int rank = 0;  // among the ranks on this host
    int size = 1;
  };
  virtual HostRanks host_ranks() = 0;

  CommunicatorStats stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

  // What one call moves, as the backends see it.
  struct Call {
    CommCall kind = CommCall::barrier;
    CommBuffer input;   // all_reduce: the buffer; all_gather: shard; reduce_scatter / all_to_all: full input
    CommBuffer output;  // all_reduce: the buffer; all_gather: full; reduce_scatter: shard; all_to_all: output
    ReduceOp op = ReduceOp::sum;
    int peer = -1;  // send / recv
    std::string name;
  };

 protected:
  Communicator(int rank, int size, std::vector<int> world_ranks, std::string axis_name,
               double collective_timeout_s, std::shared_ptr<std::string> context);
  virtual std::unique_ptr<CollectiveRequest> start(const Call& call) = 0;

 private:
  std::unique_ptr<CollectiveRequest> count_and_start(Call call, double bytes);

  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;  // group rank -> world rank, for messages
  std::string axis_name_;
  double collective_timeout_s_ = 300.0;
  std::shared_ptr<std::string> context_;
  CommunicatorStats stats_;
};

// One process: collectives are copies or nothing and move zero bytes; a send to itself is queued for the
// matching recv.
class LocalCommunicator : public Communicator {
 public:
  explicit LocalCommunicator(std::string axis_name = "world",
                             std::shared_ptr<std::string> context = std::make_shared<std::string>());
  std::unique_ptr<Communicator> split(int color, int key, const std::string& axis_name) override;
  [[noreturn]] void abort_all_ranks(int exit_code) override;
  HostRanks host_ranks() override { return {}; }

 protected:
  std::unique_ptr<CollectiveRequest> start(const Call& call) override;

 private:
  std::vector<std::vector<uint8_t>> messages_to_self_;  // FIFO of sends not yet received
};

// Set-up that every rank runs alike (the config, the mesh against the rank count, the plan, the data files):
// an error there is printed by each rank that sees it, then the ranks agree (one world all-reduce) and every
// rank stops with AlreadyReported, so no rank's exit can end the job before the others have spoken. With
// one process the error is rethrown as it is. Errors of one rank after set-up keep the coordinated abort.
void agree_on_setup_errors(Communicator& world, std::exception_ptr local_error);

template <class Setup>
auto run_setup_on_all_ranks(Communicator& world, Setup&& setup) -> decltype(setup()) {
  using Result = decltype(setup());
  if constexpr (std::is_void_v<Result>) {
    std::exception_ptr error;
    try {
      setup();
    } catch (const std::exception&) {
      error = std::current_exception();
    }
    agree_on_setup_errors(world, error);
  } else {
    std::optional<Result> result;
    std::exception_ptr error;
    try {
      result.emplace(setup());
    } catch (const std::exception&) {
      error = std::current_exception();
    }
    agree_on_setup_errors(world, error);
    return std::move(*result);
  }
}

// One sub-communicator per mesh axis, all split from the same world communicator.
struct MeshCommunicators {
  std::array<std::unique_ptr<Communicator>, kMeshAxisCount> axes;

  std::unique_ptr<Communicator>& at(MeshAxis axis) { return axes[mesh_axis_index(axis)]; }
  const std::unique_ptr<Communicator>& at(MeshAxis axis) const { return axes[mesh_axis_index(axis)]; }
};

// Splits `world` into the groups of mesh.h (every rank calls it); the mesh's devices must equal the world
// size (a MeshError naming the mesh otherwise).
MeshCommunicators make_mesh_communicators(Communicator& world, const Mesh& mesh);

// MPI (MPI_COMM_WORLD) when this process was started by an MPI launcher (started_by_mpi_launcher), a
// LocalCommunicator otherwise, so a single process needs no launcher. MPI is initialised on the first call
// and finalised at exit. collective_timeout_s must be positive (config key collective_timeout_s). srun
// starting several tasks without an MPI plugin is refused (each task would train alone).
std::unique_ptr<Communicator> make_world_communicator(double collective_timeout_s);
// mpirun (OMPI_COMM_WORLD_SIZE) or srun --mpi=pmix (PMIX_RANK) started this process.
bool started_by_mpi_launcher();

// The MPI world, whatever the environment (mpi_communicator.cpp).
std::unique_ptr<Communicator> make_mpi_world_communicator(double collective_timeout_s);

namespace testing {
// Splits MPI calls into chunks of at most this many elements (MPI counts are int); tests lower it to
// exercise the chunked path with small buffers.
void set_mpi_max_chunk_elements(int64_t elements);
}  // namespace testing

}  // namespace meshtrain
