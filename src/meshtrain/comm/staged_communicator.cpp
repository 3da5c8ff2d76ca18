// Collectives over device memory staged through host memory (staged_communicator.h).
#include "meshtrain/comm/staged_communicator.h"

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// A call's host copies of its device buffers, and which of them go back to the device when it completes.
class HostStaging {
 public:
  explicit HostStaging(const DeviceMemoryAccess& memory) : memory_(memory) {}

  // The host buffer the wrapped call uses for `buffer`: itself when it is host memory; else a host copy,
  // filled from the device when the call reads it (`read`) and copied back when it completes (`written`).
  // A device buffer inside one staged before (an all-gather's shard in its slot of the full buffer) is the
  // same place of that one's copy, so the wrapped call sees the same aliasing as the caller made.
  CommBuffer stage(const CommBuffer& buffer, bool read, bool written) {
    if (buffer.count == 0 || buffer.data == nullptr || !memory_.is_device(buffer.data)) return buffer;
    const auto* device = static_cast<const uint8_t*>(buffer.data);
    const auto bytes = static_cast<size_t>(buffer.bytes());
    uint8_t* host = nullptr;
    for (const Staged& earlier : staged_) {
      if (device >= earlier.device && device + bytes <= earlier.device + earlier.bytes) {
        host = earlier.host + (device - earlier.device);
      }
    }
    if (host == nullptr) {
      copies_.emplace_back(bytes);
      host = copies_.back().data();
      staged_.push_back({device, bytes, host});
    }
    if (read) memory_.copy_out(host, device, bytes);
    if (written) copy_back_.push_back({buffer.data, host, bytes});
    return {host, buffer.count, buffer.element};
  }

  bool empty() const { return staged_.empty(); }

  // The results to the device; the host copies are freed with this object.
  void finish() {
    for (const CopyBack& copy : copy_back_) memory_.copy_in(copy.device, copy.host, copy.bytes);
    copy_back_.clear();
  }

 private:
  struct Staged {
    const uint8_t* device;
    size_t bytes;
    uint8_t* host;
  };
  struct CopyBack {
    void* device;
    const uint8_t* host;
    size_t bytes;
  };
  DeviceMemoryAccess memory_;
  std::vector<std::vector<uint8_t>> copies_;  // the host copies (each stays put: a vector of vectors)
  std::vector<Staged> staged_;
  std::vector<CopyBack> copy_back_;
};

// The wrapped call's request; its results reach the device once it completes here.
class StagedRequest : public CollectiveRequest {
 public:
  StagedRequest(std::unique_ptr<CollectiveRequest> inner, HostStaging staging)
      : inner_(std::move(inner)), staging_(std::move(staging)) {}
  ~StagedRequest() override {
    if (!done_) wait();
  }
  bool test() override {
    if (!done_ && inner_->test()) finish();
    return done_;
  }
  void wait() override {
    if (done_) return;
    inner_->wait();
    finish();
  }

 private:
  void finish() {
    staging_.finish();
    done_ = true;
  }

  std::unique_ptr<CollectiveRequest> inner_;
  HostStaging staging_;
  bool done_ = false;
};

std::vector<int> world_ranks_of(const Communicator& communicator) {
  std::vector<int> ranks;
  for (int rank = 0; rank < communicator.size(); ++rank) ranks.push_back(communicator.world_rank_of(rank));
  return ranks;
}

class StagedCommunicator : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> inner, DeviceMemoryAccess memory)
      : Communicator(inner->rank(), inner->size(), world_ranks_of(*inner), inner->axis_name(),
                     inner->collective_timeout_s(), inner->shared_context()),
        inner_(std::move(inner)),
        memory_(memory) {}

  std::unique_ptr<Communicator> split(int color, int key, const std::string& axis_name) override {
    return stage_through_host(inner_->split(color, key, axis_name), memory_);
  }
  [[noreturn]] void abort_all_ranks(int exit_code) override {
    inner_->abort_all_ranks(exit_code);
    std::_Exit(exit_code);  // not reached: a virtual call does not carry [[noreturn]] for the compiler
  }
  HostRanks host_ranks() override { return inner_->host_ranks(); }

 protected:
  std::unique_ptr<CollectiveRequest> start(const Call& call) override {
    HostStaging staging(memory_);
    std::unique_ptr<CollectiveRequest> request;
    switch (call.kind) {
      case CommCall::all_reduce:
        request = inner_->all_reduce_start(staging.stage(call.input, true, true), call.op, call.name);
        break;
      case CommCall::all_gather: {
        // The full buffer first, so a shard in its own slot maps into the full buffer's copy.
        const CommBuffer full = staging.stage(call.output, false, true);
        request = inner_->all_gather_start(staging.stage(call.input, true, false), full, call.name);
        break;
      }
      case CommCall::reduce_scatter: {
        const CommBuffer full = staging.stage(call.input, true, false);
        request =
            inner_->reduce_scatter_start(full, staging.stage(call.output, false, true), call.op, call.name);
        break;
      }
      case CommCall::all_to_all: {
        const CommBuffer input = staging.stage(call.input, true, false);
        request = inner_->all_to_all_start(input, staging.stage(call.output, false, true), call.name);
        break;
      }
      case CommCall::send:
        request = inner_->send_start(staging.stage(call.input, true, false), call.peer, call.name);
        break;
      case CommCall::recv:
        request = inner_->recv_start(staging.stage(call.output, false, true), call.peer, call.name);
        break;
      case CommCall::barrier:
        request = inner_->barrier_start(call.name);
        break;
    }
    if (staging.empty()) return request;
    return std::make_unique<StagedRequest>(std::move(request), std::move(staging));
  }

 private:
  std::unique_ptr<Communicator> inner_;
  DeviceMemoryAccess memory_;
};

}  // namespace

std::unique_ptr<Communicator> stage_through_host(std::unique_ptr<Communicator> inner,
                                                 DeviceMemoryAccess memory) {
  MT_CHECK(inner != nullptr && memory.is_device != nullptr && memory.copy_in != nullptr &&
               memory.copy_out != nullptr,
           "a communicator and the device's memory entries to stage through host memory");
  return std::make_unique<StagedCommunicator>(std::move(inner), memory);
}

}  // namespace meshtrain
