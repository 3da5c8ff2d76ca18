// The NCCL backend: collectives over device buffers on NVIDIA GPUs, one process per GPU, behind the same
// interface, schedule and byte counters as MPI (the counting is the Communicator base's). Its own library
// (libmeshtrain_comm_nccl.so), loaded with dlopen by runtime/device_communicator.cpp only when a run needs
// it, so no other run maps NCCL.
//
// - Bootstrap over MPI: group rank 0 makes the ncclUniqueId, an all-gather of the wrapped MPI communicator
//   hands it to every rank; a split is the MPI split, then a new NCCL communicator over its ranks.
// - Host buffers (loss sums, token counts, flags, hashes) and barriers go through the wrapped MPI
//   communicator, as they did before; device buffers through NCCL.
// - Streams: kernels run on the cuda backend's one stream (kernels/cuda/device.h); NCCL runs on a stream of
//   its own. A call waits (on the device) for an event recorded on the compute stream when it starts, and
//   records an event on the communication stream when it is done: the request completes when that event
//   has; the engine touches a buffer only after its request completed, so compute overlaps communication.
// - Sends and receives are held until a request of theirs is tested or waited for, or another call on the
//   device starts, then issued together as one NCCL group: the engine starts a ring pass as a send to the
//   next rank and a receive from the previous one, which NCCL deadlocks on unless they are grouped.
// - Timeouts: the NCCL communicator is non-blocking (ncclConfig_t::blocking = 0), so every wait polls the
//   event and ncclCommGetAsyncError against the deadline. Past it, the communicator is aborted
//   (ncclCommAbort) and the ranks that arrived meet in an MPI barrier of the call's name under the same
//   timeout: MPI's protocol (mpi_communicator.cpp) then names the ranks that did not arrive, with the message
//   a stall under MPI gives, and ends the job.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cuda/device.h"

namespace meshtrain {
namespace {

using Clock = std::chrono::steady_clock;

void check_nccl(ncclResult_t result, const char* call, ncclComm_t comm) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  fail(std::string("NCCL (") + call + ")", "success",
       std::string(ncclGetErrorString(result)) + ": " + ncclGetLastError(comm),
       "run with NCCL_DEBUG=INFO to see why; several processes on one GPU need share_gpus=true");
}

#define MT_NCCL(call, comm) check_nccl((call), #call, (comm))

ncclDataType_t nccl_type(CommElement element) {
  switch (element) {
    case CommElement::f32:
      return ncclFloat32;
    case CommElement::bf16:
      return ncclBfloat16;
    case CommElement::i32:
      return ncclInt32;
    case CommElement::u8:
      return ncclUint8;
    case CommElement::f64:
      return ncclFloat64;
    case CommElement::i64:
      return ncclInt64;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::sum ? ncclSum : ncclMax;
}

std::vector<int> world_ranks_of(const Communicator& communicator) {
  std::vector<int> ranks;
  for (int rank = 0; rank < communicator.size(); ++rank) ranks.push_back(communicator.world_rank_of(rank));
  return ranks;
}

class NcclCommunicator;

// The event recorded on the communication stream after a call (or a group of sends and receives) was
// enqueued; null while the sends and receives it stands for are still held.
struct IssuedEvent {
  cudaEvent_t event = nullptr;
  IssuedEvent() = default;
  IssuedEvent(const IssuedEvent&) = delete;
  IssuedEvent& operator=(const IssuedEvent&) = delete;
  ~IssuedEvent() {
    if (event != nullptr) static_cast<void>(cudaEventDestroy(event));
  }
};

// One NCCL call in flight: done when its event on the communication stream is.
class NcclRequest : public CollectiveRequest {
 public:
  NcclRequest(NcclCommunicator& owner, std::shared_ptr<IssuedEvent> done, Communicator::Call call,
              Clock::time_point deadline)
      : owner_(owner), done_event_(std::move(done)), call_(std::move(call)), deadline_(deadline) {}
  ~NcclRequest() override {
    if (!done_) wait();
  }
  bool test() override;
  void wait() override {
    const Clock::time_point began = Clock::now();
    while (!test()) {
      if (Clock::now() - began > std::chrono::seconds(1))
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  NcclCommunicator& owner_;
  std::shared_ptr<IssuedEvent> done_event_;
  Communicator::Call call_;
  Clock::time_point deadline_;
  bool done_ = false;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> mpi, ncclComm_t comm, cudaStream_t stream)
      : Communicator(mpi->rank(), mpi->size(), world_ranks_of(*mpi), mpi->axis_name(),
                     mpi->collective_timeout_s(), mpi->shared_context()),
        mpi_(std::move(mpi)),
        comm_(comm),
        stream_(stream) {
    MT_CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  }
  ~NcclCommunicator() override {
    if (!aborted_) static_cast<void>(ncclCommDestroy(comm_));
    static_cast<void>(cudaEventDestroy(ready_));
    static_cast<void>(cudaStreamDestroy(stream_));
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& axis_name) override;
  [[noreturn]] void abort_all_ranks(int exit_code) override {
    abort_nccl();
    mpi_->abort_all_ranks(exit_code);
    std::_Exit(exit_code);  // not reached: a virtual call does not carry [[noreturn]] for the compiler
  }
  HostRanks host_ranks() override { return mpi_->host_ranks(); }

  // A failure NCCL reported for this communicator (a peer gone, a network error): the job ends.
  void check_async_error() {
    ncclResult_t state = ncclSuccess;
    MT_NCCL(ncclCommGetAsyncError(comm_, &state), comm_);
    if (state != ncclSuccess && state != ncclInProgress) {
      std::fprintf(stderr, "meshtrain: error (rank %d): NCCL on the %s axis: %s: %s\n", world_rank_of(rank()),
                   axis_name().c_str(), ncclGetErrorString(state), ncclGetLastError(comm_));
      abort_all_ranks(1);
    }
  }

  // Past a call's deadline: NCCL stops, and MPI names the ranks that did not arrive (see the top).
  [[noreturn]] void on_timeout(const Call& call) {
    abort_nccl();
    mpi_->barrier(call.name);
    // Every rank of the group arrived, yet NCCL did not complete: a link or a rank outside this group.
    std::fprintf(
        stderr,
        "meshtrain: error: collective %s '%s'%s timed out after %g s on the %s axis: every rank arrived, "
        "yet NCCL did not complete it (reported by rank %d)\n",
        comm_call_name(call.kind).c_str(), call.name.c_str(),
        context().empty() ? "" : (" at " + context()).c_str(), collective_timeout_s(), axis_name().c_str(),
        world_rank_of(rank()));
    mpi_->abort_all_ranks(1);
    std::_Exit(1);
  }

  // The held sends and receives as one NCCL group.
  void issue_point_to_point();

 protected:
  std::unique_ptr<CollectiveRequest> start(const Call& call) override;

 private:
  // After the calls just enqueued: an event on the communication stream that says they are done.
  std::shared_ptr<IssuedEvent> record_done(std::shared_ptr<IssuedEvent> done) {
    MT_CUDA(cudaEventCreateWithFlags(&done->event, cudaEventDisableTiming));
    MT_CUDA(cudaEventRecord(done->event, stream_));
    return done;
  }
  // The communication stream waits for the kernels queued so far on the compute stream (they write what
  // is sent, and they read what a receive overwrites).
  void after_compute() {
    MT_CUDA(cudaEventRecord(ready_, kernels::cuda::stream()));
    MT_CUDA(cudaStreamWaitEvent(stream_, ready_, 0));
  }

  void abort_nccl() {
    if (!aborted_) static_cast<void>(ncclCommAbort(comm_));
    aborted_ = true;
  }

  // Non-blocking NCCL: a call may return before it is enqueued; wait for that (not for the transfer).
  void wait_enqueued(const Call& call, Clock::time_point deadline) {
    while (true) {
      ncclResult_t state = ncclSuccess;
      MT_NCCL(ncclCommGetAsyncError(comm_, &state), comm_);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) check_async_error();
      if (Clock::now() > deadline) on_timeout(call);
      std::this_thread::yield();
    }
  }

  std::unique_ptr<Communicator> mpi_;
  ncclComm_t comm_;
  cudaStream_t stream_;  // communication
  cudaEvent_t ready_;    // recorded on the compute stream when a call starts
  bool aborted_ = false;
  std::vector<Call> held_;  // sends and receives not issued yet, in the order they started
  std::shared_ptr<IssuedEvent> held_done_;
  Clock::time_point held_deadline_;
};

bool NcclRequest::test() {
  if (done_) return true;
  if (done_event_->event == nullptr) owner_.issue_point_to_point();
  const cudaError_t state = cudaEventQuery(done_event_->event);
  if (state == cudaSuccess) {
    done_ = true;
    return true;
  }
  if (state != cudaErrorNotReady) MT_CUDA(state);
  owner_.check_async_error();
  if (Clock::now() > deadline_) owner_.on_timeout(call_);
  return false;
}

// Rank 0's unique id to every rank of `mpi`, then the NCCL communicator over them, under the timeout.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> mpi) {
  kernels::cuda::stream();  // selects this process's GPU (kernels/cuda/device.h) before NCCL uses one
  ncclUniqueId id{};
  if (mpi->rank() == 0) MT_NCCL(ncclGetUniqueId(&id), nullptr);
  std::vector<uint8_t> mine(sizeof(id)), every(sizeof(id) * static_cast<size_t>(mpi->size()));
  std::memcpy(mine.data(), &id, sizeof(id));
  // The interface has no broadcast: every rank's bytes to every rank, and rank 0's are the id.
  mpi->all_gather(comm_buffer(mine), comm_buffer(every), "nccl/unique_id/" + mpi->axis_name());
  std::memcpy(&id, every.data(), sizeof(id));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so a rank that never joins is a timeout here, not a hang
  ncclComm_t comm = nullptr;
  MT_NCCL(ncclCommInitRankConfig(&comm, mpi->size(), id, mpi->rank(), &config), comm);
  const Clock::time_point deadline =
      Clock::now() +
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(mpi->collective_timeout_s()));
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    MT_NCCL(ncclCommGetAsyncError(comm, &state), comm);
    if (state == ncclInProgress && Clock::now() > deadline) {
      static_cast<void>(ncclCommAbort(comm));
      // The ranks that arrived meet in MPI, which names the ones that did not.
      mpi->barrier("nccl/init/" + mpi->axis_name());
      fail("NCCL (ncclCommInitRankConfig)",
           "the " + mpi->axis_name() + " axis's NCCL communicator within collective_timeout_s",
           "not ready after " + to_text(mpi->collective_timeout_s()) + " s with every rank arrived",
           "run with NCCL_DEBUG=INFO to see why");
    }
    std::this_thread::yield();
  }
  MT_NCCL(state, comm);
  cudaStream_t stream = nullptr;
  MT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::make_unique<NcclCommunicator>(std::move(mpi), comm, stream);
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, const std::string& axis_name) {
  return make_nccl_communicator(mpi_->split(color, key, axis_name));
}

bool on_device(const CommBuffer& buffer) {
  return buffer.count > 0 && buffer.data != nullptr && kernels::cuda::memory_is_device(buffer.data);
}

std::unique_ptr<CollectiveRequest> NcclCommunicator::start(const Call& call) {
  const bool input_on_device = on_device(call.input), output_on_device = on_device(call.output);
  if (call.kind == CommCall::barrier || (!input_on_device && !output_on_device)) {
    switch (call.kind) {  // host memory: MPI, as before
      case CommCall::all_reduce:
        return mpi_->all_reduce_start(call.input, call.op, call.name);
      case CommCall::all_gather:
        return mpi_->all_gather_start(call.input, call.output, call.name);
      case CommCall::reduce_scatter:
        return mpi_->reduce_scatter_start(call.input, call.output, call.op, call.name);
      case CommCall::all_to_all:
        return mpi_->all_to_all_start(call.input, call.output, call.name);
      case CommCall::send:
        return mpi_->send_start(call.input, call.peer, call.name);
      case CommCall::recv:
        return mpi_->recv_start(call.output, call.peer, call.name);
      case CommCall::barrier:
        return mpi_->barrier_start(call.name);
    }
  }
  const bool two_buffers = call.kind == CommCall::all_gather || call.kind == CommCall::reduce_scatter ||
                           call.kind == CommCall::all_to_all;
  MT_CHECK(
      !two_buffers || call.input.count == 0 || call.output.count == 0 || input_on_device == output_on_device,
      call.name + ": one buffer in host memory and the other on the device");
  const Clock::time_point deadline =
      Clock::now() +
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(collective_timeout_s()));
  if (call.kind == CommCall::send || call.kind == CommCall::recv) {
    if (held_.empty()) {
      held_done_ = std::make_shared<IssuedEvent>();
      held_deadline_ = deadline;
    }
    held_.push_back(call);
    return std::make_unique<NcclRequest>(*this, held_done_, call, deadline);
  }
  issue_point_to_point();  // every rank issues the held ones before this call, in the same order
  after_compute();
  const ncclDataType_t type = nccl_type(call.input.element);
  const auto count = [](const CommBuffer& buffer) { return static_cast<size_t>(buffer.count); };
  switch (call.kind) {
    case CommCall::all_reduce:
      MT_NCCL(ncclAllReduce(call.input.data, call.input.data, count(call.input), type, nccl_op(call.op),
                            comm_, stream_),
              comm_);
      break;
    case CommCall::all_gather:  // in place when the shard is its own slot of the full buffer, as NCCL defines
                                // it
      MT_NCCL(ncclAllGather(call.input.data, call.output.data, count(call.input), type, comm_, stream_),
              comm_);
      break;
    case CommCall::reduce_scatter:
      MT_NCCL(ncclReduceScatter(call.input.data, call.output.data, count(call.output), type, nccl_op(call.op),
                                comm_, stream_),
              comm_);
      break;
    case CommCall::all_to_all: {
      // Block j of the input to rank j, block i of the output from rank i: one send and one receive per rank.
      const size_t block = count(call.input) / static_cast<size_t>(size());
      const size_t block_bytes = block * comm_element_bytes(call.input.element);
      MT_NCCL(ncclGroupStart(), comm_);
      for (int peer = 0; peer < size(); ++peer) {
        const size_t offset = static_cast<size_t>(peer) * block_bytes;
        MT_NCCL(
            ncclSend(static_cast<const char*>(call.input.data) + offset, block, type, peer, comm_, stream_),
            comm_);
        MT_NCCL(ncclRecv(static_cast<char*>(call.output.data) + offset, block, type, peer, comm_, stream_),
                comm_);
      }
      MT_NCCL(ncclGroupEnd(), comm_);
      break;
    }
    case CommCall::send:
    case CommCall::recv:
    case CommCall::barrier:
      break;  // held above, or MPI's
  }
  wait_enqueued(call, deadline);
  return std::make_unique<NcclRequest>(*this, record_done(std::make_shared<IssuedEvent>()), call, deadline);
}

void NcclCommunicator::issue_point_to_point() {
  if (held_.empty()) return;
  after_compute();
  MT_NCCL(ncclGroupStart(), comm_);
  for (const Call& call : held_) {
    const CommBuffer& buffer = call.kind == CommCall::send ? call.input : call.output;
    if (call.kind == CommCall::send) {
      MT_NCCL(ncclSend(buffer.data, static_cast<size_t>(buffer.count), nccl_type(buffer.element), call.peer,
                       comm_, stream_),
              comm_);
    } else {
      MT_NCCL(ncclRecv(buffer.data, static_cast<size_t>(buffer.count), nccl_type(buffer.element), call.peer,
                       comm_, stream_),
              comm_);
    }
  }
  MT_NCCL(ncclGroupEnd(), comm_);
  const Call first = held_.front();
  held_.clear();
  wait_enqueued(first, held_deadline_);
  record_done(std::move(held_done_));
}

}  // namespace
}  // namespace meshtrain

// The entry runtime/device_communicator.cpp looks up: NCCL over `mpi` (ownership passes to the result).
extern "C" meshtrain::Communicator* meshtrain_nccl_communicator(meshtrain::Communicator* mpi) {
  return meshtrain::make_nccl_communicator(std::unique_ptr<meshtrain::Communicator>(mpi)).release();
}
