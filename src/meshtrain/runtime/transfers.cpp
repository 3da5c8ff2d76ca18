// The plan's send_recv ops, non-blocking: started by their op, completed before their memory is touched.
#include "meshtrain/runtime/transfers.h"

#include <algorithm>

#include "meshtrain/metrics/trace.h"

namespace meshtrain {

void Transfers::start(Communicator& comm, int64_t peer_offset, const TensorView& send,
                      const TensorView& receive, const std::string& name) {
  const int64_t size = comm.size();
  const int64_t shift = ((peer_offset % size) + size) % size;
  InFlight transfer{name, {}, {}};
  // The receive is posted first, so the peer's message can land in place (MPI buffers one that arrives
  // before its receive).
  if (receive.data != nullptr) {
    const int from = static_cast<int>((comm.rank() + size - shift) % size);
    transfer.requests.push_back(comm.recv_start(comm_buffer(receive), from, name));
    const auto* begin = static_cast<const std::byte*>(receive.data);
    transfer.memory.emplace_back(begin, begin + receive.bytes());
  }
  if (send.data != nullptr) {
    const int to = static_cast<int>((comm.rank() + shift) % size);
    transfer.requests.push_back(comm.send_start(comm_buffer(send), to, name));
    const auto* begin = static_cast<const std::byte*>(send.data);
    transfer.memory.emplace_back(begin, begin + send.bytes());
  }
  in_flight_.push_back(std::move(transfer));
}

void Transfers::start_one(Communicator& comm, int peer, const TensorView& memory, bool sending,
                          const std::string& name) {
  InFlight transfer{name, {}, {}};
  transfer.requests.push_back(sending ? comm.send_start(comm_buffer(memory), peer, name)
                                      : comm.recv_start(comm_buffer(memory), peer, name));
  const auto* begin = static_cast<const std::byte*>(memory.data);
  transfer.memory.emplace_back(begin, begin + memory.bytes());
  in_flight_.push_back(std::move(transfer));
}

void Transfers::wait(InFlight& transfer, TraceRecorder* trace) {
  const std::string label = "wait " + transfer.name;
  const TraceScope scope(trace, label, "collective");
  for (const std::unique_ptr<CollectiveRequest>& request : transfer.requests) request->wait();
}

void Transfers::wait_touching(const TensorView& memory, TraceRecorder* trace) {
  const auto* begin = static_cast<const std::byte*>(memory.data);
  const std::byte* end = begin + memory.bytes();
  const auto overlaps = [&](const InFlight& transfer) {
    return std::any_of(transfer.memory.begin(), transfer.memory.end(),
                       [&](const auto& range) { return range.first < end && begin < range.second; });
  };
  for (InFlight& transfer : in_flight_) {
    if (overlaps(transfer)) wait(transfer, trace);
  }
  std::erase_if(in_flight_, overlaps);
}

void Transfers::wait_all(TraceRecorder* trace) {
  for (InFlight& transfer : in_flight_) wait(transfer, trace);
  in_flight_.clear();
}

void Transfers::progress() {
  for (InFlight& transfer : in_flight_) {
    for (const std::unique_ptr<CollectiveRequest>& request : transfer.requests) request->test();
  }
}

void Transfers::release_unwaited() {
  for (InFlight& transfer : in_flight_) {
    for (std::unique_ptr<CollectiveRequest>& request : transfer.requests)
      static_cast<void>(request.release());
  }
  in_flight_.clear();
}

}  // namespace meshtrain
