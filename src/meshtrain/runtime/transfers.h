// Point-to-point transfers in flight: the plan's send_recv ops (the context axis' halos), and a pipeline
// program's transfers (its activations and their gradients between stage ranks). An op starts its transfer without waiting; anything that touches the
// transfer's memory again waits for it first, and a kernel ends with none in flight.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/core/tensor.h"

namespace meshtrain {

class TraceRecorder;

class Transfers {
 public:
  // Starts sending `send` to the rank `peer_offset` further along `comm` (modulo its size) and receiving
  // `receive` from the rank as far back. Either may be empty (null data): a pipeline's first stage receives
  // nothing, its last sends nothing. Counted by `comm` like every collective (the bytes sent).
  void start(Communicator& comm, int64_t peer_offset, const TensorView& send, const TensorView& receive,
             const std::string& name);
  // Starts one send of `memory` to rank `peer` of `comm` (`sending`), or one receive into it from there: a
  // pipeline's transfer between stage ranks.
  void start_one(Communicator& comm, int peer, const TensorView& memory, bool sending, const std::string& name);
  // Waits for each transfer whose memory overlaps `memory` (an op is about to read or write it); each wait
  // is a trace event.
  void wait_touching(const TensorView& memory, TraceRecorder* trace);
  void wait_all(TraceRecorder* trace);
  // Moves the transfers along: MPI progresses a non-blocking call only inside MPI calls.
  void progress();
  bool empty() const { return in_flight_.empty(); }
  // Unwinding from an error: forgets the transfers unwaited (their peers may be waiting elsewhere).
  void release_unwaited();

 private:
  struct InFlight {
    std::string name;
    std::vector<std::pair<const std::byte*, const std::byte*>> memory;  // [begin, end) sent and received
    std::vector<std::unique_ptr<CollectiveRequest>> requests;
  };
  static void wait(InFlight& transfer, TraceRecorder* trace);
  std::vector<InFlight> in_flight_;
};

}  // namespace meshtrain
