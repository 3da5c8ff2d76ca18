// The MPI backend (OpenMPI): every call is a non-blocking MPI call polled against a deadline, and a
// timeout finds out which ranks did not arrive instead of hanging.
//
// Timeout protocol (messages on a duplicate "control" communicator, so they never match data traffic;
// nothing is sent while collectives complete in time):
// - Every collective of a group gets the next sequence number (all ranks issue them in the same order).
// - A rank whose wait passes its deadline sends STALLED(sequence) to the group's rank 0, the coordinator,
//   and keeps polling. The coordinator, when its own wait passes the deadline or a STALLED arrives for a
//   collective it has started, sends QUERY to every rank and collects REPLY(latest started sequence) for a
//   grace period. Ranks whose latest started sequence is lower, or that do not answer, did not arrive.
//   The coordinator sends the VERDICT line to the ranks that arrived; each prints it, acknowledges, and
//   the coordinator calls MPI_Abort. If the coordinator never answers, the others say so and abort.
// - Waiting ranks answer QUERY for every communicator of the process, so a rank that started a collective
//   and now waits in another one still counts as arrived.
// - send / recv involve two ranks: the waiting rank names its peer at once.
#define OMPI_SKIP_MPICXX 1  // the C API only: no link dependency on the removed C++ bindings
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

using Clock = std::chrono::steady_clock;

int64_t max_chunk_elements = INT_MAX;  // MPI counts are int

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", seconds);
  return text;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return text;
}

// bf16 reductions: widen to f32, reduce, round to nearest even (NaN stays NaN).
void bf16_sum(void* input, void* input_output, int* count, MPI_Datatype* /*type*/) {
  const auto* in = static_cast<const uint16_t*>(input);
  auto* inout = static_cast<uint16_t*>(input_output);
  for (int i = 0; i < *count; ++i)
    inout[i] = bfloat16_from_float(float_from_bfloat16(in[i]) + float_from_bfloat16(inout[i]));
}

void bf16_max(void* input, void* input_output, int* count, MPI_Datatype* /*type*/) {
  const auto* in = static_cast<const uint16_t*>(input);
  auto* inout = static_cast<uint16_t*>(input_output);
  for (int i = 0; i < *count; ++i) {
    if (float_from_bfloat16(in[i]) > float_from_bfloat16(inout[i])) inout[i] = in[i];
  }
}

class MpiCommunicator;

// MPI_Init_thread on first use, MPI_Finalize at exit (a function-local static: communicators created
// after it are destroyed before it).
class MpiRuntime {
 public:
  static MpiRuntime& instance() {
    static MpiRuntime runtime;
    return runtime;
  }
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  MPI_Datatype type_of(CommElement element) const {
    switch (element) {
      case CommElement::f32:
        return MPI_FLOAT;
      case CommElement::bf16:
        return bf16_type_;
      case CommElement::i32:
        return MPI_INT32_T;
      case CommElement::u8:
        return MPI_UINT8_T;
      case CommElement::f64:
        return MPI_DOUBLE;
      case CommElement::i64:
        return MPI_INT64_T;
    }
    return MPI_BYTE;
  }
  MPI_Op op_of(ReduceOp op, CommElement element) const {
    if (element == CommElement::bf16) return op == ReduceOp::sum ? bf16_sum_ : bf16_max_;
    return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
  }

  std::vector<MpiCommunicator*> live;  // every communicator, polled for control messages while waiting
  Clock::time_point last_poll{};

 private:
  MpiRuntime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      // SERIALIZED: OpenMP threads never call MPI; a communicator is used by one thread at a time.
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      if (provided < MPI_THREAD_FUNNELED) {
        fail("MPI", "an MPI library with thread support (MPI_THREAD_FUNNELED or better)",
             "thread level " + std::to_string(provided), "use the OpenMPI of scripts/setup.sh");
      }
    }
    MPI_Type_contiguous(2, MPI_BYTE, &bf16_type_);
    MPI_Type_commit(&bf16_type_);
    MPI_Op_create(&bf16_sum, 1, &bf16_sum_);
    MPI_Op_create(&bf16_max, 1, &bf16_max_);
  }
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Op_free(&bf16_sum_);
    MPI_Op_free(&bf16_max_);
    MPI_Type_free(&bf16_type_);
    MPI_Finalize();
  }

  MPI_Datatype bf16_type_ = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
  MPI_Op bf16_max_ = MPI_OP_NULL;
};

enum ControlTag : int { kStalled = 1, kQuery = 2, kReply = 3, kVerdict = 4, kAck = 5 };

// What a rank says about a collective when asked (fixed size: sent as bytes).
struct ControlMessage {
  uint64_t sequence = 0;        // the collective concerned
  uint64_t latest_started = 0;  // the sender's latest started collective on this communicator
  uint64_t described = 0;       // the sequence that kind and name describe (0: none)
  int32_t kind = -1;
  char name[100] = {};
};

// One started call, for deadlines and messages.
struct CallRecord {
  uint64_t sequence = 0;  // collectives: group-wide number; send / recv: this rank's own count
  CommCall kind = CommCall::barrier;
  std::string name;
  int peer = -1;  // send / recv: group rank
  Clock::time_point deadline;
};

[[noreturn]] void abort_job(int exit_code) {
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this satisfies [[noreturn]]
}

class MpiCommunicator : public Communicator {
 public:
  // Takes ownership of `comm`.
  MpiCommunicator(MPI_Comm comm, std::string axis_name, double collective_timeout_s,
                  std::shared_ptr<std::string> context)
      : Communicator(rank_in(comm), size_of(comm), world_ranks_of(comm), std::move(axis_name),
                     collective_timeout_s, std::move(context)),
        comm_(comm),
        answers_(static_cast<size_t>(size())) {
    MPI_Comm_dup(comm_, &control_);
    MpiRuntime::instance().live.push_back(this);
  }

  ~MpiCommunicator() override {
    auto& live = MpiRuntime::instance().live;
    live.erase(std::remove(live.begin(), live.end(), this), live.end());
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Request& request : outbox_requests_) {
      if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
    }
    MPI_Comm_free(&control_);
    MPI_Comm_free(&comm_);
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& axis_name) override {
    // MPI_Comm_split blocks without a timeout: a barrier first names a rank that never comes.
    barrier("split/" + axis_name);
    MPI_Comm sub;
    MPI_Comm_split(comm_, color, key, &sub);
    return std::make_unique<MpiCommunicator>(sub, axis_name, collective_timeout_s(), shared_context());
  }

  [[noreturn]] void abort_all_ranks(int exit_code) override { abort_job(exit_code); }

  HostRanks host_ranks() override {
    barrier("host_ranks");  // MPI_Comm_split_type blocks without a timeout, as MPI_Comm_split does
    MPI_Comm host;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &host);
    HostRanks ranks;
    MPI_Comm_rank(host, &ranks.rank);
    MPI_Comm_size(host, &ranks.size);
    MPI_Comm_free(&host);
    return ranks;
  }

  // Answers other ranks' timeout checks on every communicator of this process (at most every millisecond).
  static void poll_all_control() {
    MpiRuntime& runtime = MpiRuntime::instance();
    const Clock::time_point now = Clock::now();
    if (now - runtime.last_poll < std::chrono::milliseconds(1)) return;
    runtime.last_poll = now;
    const std::vector<MpiCommunicator*> live = runtime.live;  // a handler may not return, never mutates
    for (MpiCommunicator* communicator : live) communicator->poll_control();
  }

  [[noreturn]] void on_timeout(const CallRecord& call);

 protected:
  std::unique_ptr<CollectiveRequest> start(const Call& call) override;

 private:
  static int rank_in(MPI_Comm comm) {
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    return rank;
  }
  static int size_of(MPI_Comm comm) {
    int size = 0;
    MPI_Comm_size(comm, &size);
    return size;
  }
  static std::vector<int> world_ranks_of(MPI_Comm comm) {
    MPI_Group group, world_group;
    MPI_Comm_group(comm, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    std::vector<int> group_ranks(static_cast<size_t>(size_of(comm)));
    for (size_t i = 0; i < group_ranks.size(); ++i) group_ranks[i] = static_cast<int>(i);
    std::vector<int> world_ranks(group_ranks.size());
    MPI_Group_translate_ranks(group, static_cast<int>(group_ranks.size()), group_ranks.data(), world_group,
                              world_ranks.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    return world_ranks;
  }

  ControlMessage describe(uint64_t sequence) const {
    ControlMessage message;
    message.sequence = sequence;
    message.latest_started = latest_collective_;
    // A rank that has not started `sequence` describes where it is instead.
    const uint64_t wanted = std::min(sequence, latest_collective_);
    for (const CallRecord& record : recent_) {
      if (record.sequence != wanted) continue;
      message.described = record.sequence;
      message.kind = static_cast<int32_t>(record.kind);
      std::snprintf(message.name, sizeof(message.name), "%s", record.name.c_str());
    }
    return message;
  }

  static std::string describe_text(const ControlMessage& message) {
    if (message.described == 0 || message.kind < 0) return "has started no collective here";
    return "is at #" + std::to_string(message.described) + " " +
           comm_call_name(static_cast<CommCall>(message.kind)) + " '" + message.name + "'";
  }

  std::string call_text(const CallRecord& call) const {
    std::string text = (call.kind == CommCall::send || call.kind == CommCall::recv ? "" : "collective ") +
                       comm_call_name(call.kind) + " '" + call.name + "'";
    if (call.kind == CommCall::send) text += " to rank " + std::to_string(world_rank_of(call.peer));
    if (call.kind == CommCall::recv) text += " from rank " + std::to_string(world_rank_of(call.peer));
    text += " #" + std::to_string(call.sequence);
    if (!context().empty()) text += " at " + context();
    return text + " timed out after " + seconds_text(collective_timeout_s()) + " s on the " + axis_name() +
           " axis: ";
  }

  // Control messages live until sent; only failures send any, so the outbox never grows in a healthy run.
  void send_control(int group_rank, ControlTag tag, const void* data, size_t bytes) {
    outbox_.emplace_back(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    outbox_requests_.push_back(MPI_REQUEST_NULL);
    MPI_Isend(outbox_.back().data(), static_cast<int>(bytes), MPI_BYTE, group_rank, tag, control_,
              &outbox_requests_.back());
  }

  [[noreturn]] void print_and_abort(const std::string& line) {
    std::fprintf(stderr, "meshtrain: error: %s (reported by rank %d)\n", line.c_str(), world_rank_of(rank()));
    abort_job(1);
  }

  void poll_control();
  void handle_control(int source, int tag, const std::vector<char>& message);
  [[noreturn]] void investigate(uint64_t sequence);
  [[noreturn]] void follow_verdict(const std::string& line);

  double reply_grace_s() const { return std::clamp(collective_timeout_s() / 4.0, 1.0, 10.0); }

  MPI_Comm comm_ = MPI_COMM_NULL;     // data
  MPI_Comm control_ = MPI_COMM_NULL;  // timeout protocol
  uint64_t latest_collective_ = 0;    // sequence of the latest started collective (they count from 1)
  uint64_t latest_point_to_point_ = 0;
  std::deque<CallRecord> recent_;                       // the last collectives started, for replies
  std::vector<std::optional<ControlMessage>> answers_;  // coordinator: what each rank reported
  uint64_t reported_stall_ = 0;  // coordinator: lowest sequence another rank stalled in
  bool investigating_ = false;
  int acknowledgements_ = 0;
  std::deque<std::vector<char>> outbox_;  // deque: buffers stay put while MPI sends them
  std::deque<MPI_Request> outbox_requests_;
};

class MpiRequest : public CollectiveRequest {
 public:
  MpiRequest(MpiCommunicator& communicator, std::vector<MPI_Request> requests, CallRecord call)
      : communicator_(communicator), requests_(std::move(requests)), call_(std::move(call)) {}
  ~MpiRequest() override {
    if (!done_) wait();
  }

  bool test() override {
    if (done_) return true;
    int complete = 0;
    MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &complete, MPI_STATUSES_IGNORE);
    if (complete) {
      done_ = true;
      return true;
    }
    MpiCommunicator::poll_all_control();
    if (Clock::now() > call_.deadline) communicator_.on_timeout(call_);
    return false;
  }

  void wait() override {
    const Clock::time_point began = Clock::now();
    while (!test()) {
      // Spin first (latency), then yield to the rank's other threads, then sleep: a long wait is a
      // straggler, and burning its core helps nobody.
      const double waited = seconds_since(began);
      if (waited > 1.0) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else if (waited > 1e-3) {
        std::this_thread::yield();
      }
    }
  }

 private:
  MpiCommunicator& communicator_;
  std::vector<MPI_Request> requests_;
  CallRecord call_;
  bool done_ = false;
};

std::unique_ptr<CollectiveRequest> MpiCommunicator::start(const Call& call) {
  const MpiRuntime& runtime = MpiRuntime::instance();
  CallRecord record;
  record.kind = call.kind;
  record.name = call.name;
  record.peer = call.peer;
  record.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(collective_timeout_s()));
  const bool point_to_point = call.kind == CommCall::send || call.kind == CommCall::recv;
  if (point_to_point) {
    record.sequence = ++latest_point_to_point_;
  } else {
    record.sequence = ++latest_collective_;
    recent_.push_back(record);
    if (recent_.size() > 256) recent_.pop_front();
  }

  std::vector<MPI_Request> requests;
  const auto post = [&requests]() -> MPI_Request* {
    requests.push_back(MPI_REQUEST_NULL);
    return &requests.back();
  };
  const CommBuffer& buffer = call.kind == CommCall::send ? call.input : call.output;
  const MPI_Datatype type = runtime.type_of(buffer.element);
  const size_t element_bytes = comm_element_bytes(buffer.element);
  const int64_t block = size() > 0 ? call.output.count / size() : 0;  // per-rank block of gather/scatter
  const auto check_block = [&](int64_t count) {
    MT_CHECK(count <= max_chunk_elements, call.name + ": " + comm_call_name(call.kind) + " block of " +
                                              std::to_string(count) + " elements exceeds MPI's int count; " +
                                              "split the buffer into buckets");
  };
  switch (call.kind) {
    case CommCall::all_reduce:
    case CommCall::send:
    case CommCall::recv: {
      // Element-wise and order-preserving, so large buffers go in chunks of at most max_chunk_elements.
      requests.reserve(static_cast<size_t>(buffer.count / max_chunk_elements + 1));
      int64_t offset = 0;
      do {
        const int count = static_cast<int>(std::min(buffer.count - offset, max_chunk_elements));
        char* data = static_cast<char*>(buffer.data) + static_cast<size_t>(offset) * element_bytes;
        if (call.kind == CommCall::all_reduce) {
          MPI_Iallreduce(MPI_IN_PLACE, data, count, type, runtime.op_of(call.op, buffer.element), comm_,
                         post());
        } else if (call.kind == CommCall::send) {
          MPI_Isend(data, count, type, call.peer, 0, comm_, post());
        } else {
          MPI_Irecv(data, count, type, call.peer, 0, comm_, post());
        }
        offset += count;
      } while (offset < buffer.count);
      break;
    }
    case CommCall::all_gather: {
      check_block(call.input.count);
      const char* own_slot = static_cast<const char*>(call.output.data) +
                             static_cast<size_t>(rank()) * static_cast<size_t>(call.input.bytes());
      // ZeRO-1 gathers a parameter whose shard already sits in its slot of the full buffer.
      const void* send = call.input.data == own_slot ? MPI_IN_PLACE : call.input.data;
      MPI_Iallgather(send, static_cast<int>(call.input.count), type, call.output.data,
                     static_cast<int>(call.input.count), type, comm_, post());
      break;
    }
    case CommCall::reduce_scatter:
      check_block(call.output.count);
      MPI_Ireduce_scatter_block(call.input.data, call.output.data, static_cast<int>(call.output.count), type,
                                runtime.op_of(call.op, buffer.element), comm_, post());
      break;
    case CommCall::all_to_all:
      check_block(block);
      MPI_Ialltoall(call.input.data, static_cast<int>(block), type, call.output.data, static_cast<int>(block),
                    type, comm_, post());
      break;
    case CommCall::barrier:
      MPI_Ibarrier(comm_, post());
      break;
  }
  return std::make_unique<MpiRequest>(*this, std::move(requests), std::move(record));
}

void MpiCommunicator::poll_control() {
  while (true) {
    int found = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, control_, &found, &status);
    if (!found) break;
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    std::vector<char> message(static_cast<size_t>(bytes));
    MPI_Recv(message.data(), bytes, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, control_, MPI_STATUS_IGNORE);
    handle_control(status.MPI_SOURCE, status.MPI_TAG, message);
  }
  // A coordinator that arrives after another rank's deadline investigates as soon as it has started the
  // collective the others stalled in.
  if (rank() == 0 && !investigating_ && reported_stall_ != 0 && reported_stall_ <= latest_collective_) {
    investigate(reported_stall_);
  }
}

void MpiCommunicator::handle_control(int source, int tag, const std::vector<char>& message) {
  ControlMessage control;
  if (tag == kStalled || tag == kQuery || tag == kReply) {
    MT_CHECK(message.size() == sizeof(control),
             "control message of " + std::to_string(message.size()) + " bytes");
    std::memcpy(&control, message.data(), sizeof(control));
  }
  switch (tag) {
    case kStalled:
      answers_[static_cast<size_t>(source)] = control;
      if (reported_stall_ == 0 || control.sequence < reported_stall_) reported_stall_ = control.sequence;
      break;
    case kQuery: {
      const ControlMessage reply = describe(control.sequence);
      send_control(source, kReply, &reply, sizeof(reply));
      break;
    }
    case kReply:
      answers_[static_cast<size_t>(source)] = control;
      break;
    case kVerdict:
      follow_verdict(std::string(message.begin(), message.end()));
    case kAck:
      ++acknowledgements_;
      break;
    default:
      MT_CHECK(false, "unknown control tag " + std::to_string(tag));
  }
}

void MpiCommunicator::follow_verdict(const std::string& line) {
  std::fprintf(stderr, "meshtrain: error: %s (reported by rank %d)\n", line.c_str(), world_rank_of(rank()));
  std::fflush(stderr);
  const char acknowledgement = 1;
  send_control(0, kAck, &acknowledgement, sizeof(acknowledgement));
  // The coordinator aborts the job once every arrived rank has printed; abort here if it does not.
  const Clock::time_point began = Clock::now();
  while (seconds_since(began) < 5.0) {
    for (MPI_Request& request : outbox_requests_) {
      int sent = 0;
      if (request != MPI_REQUEST_NULL) MPI_Test(&request, &sent, MPI_STATUS_IGNORE);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  abort_job(1);
}

void MpiCommunicator::investigate(uint64_t sequence) {
  if (investigating_) abort_job(1);  // a failure inside the investigation: end the job, never hang
  investigating_ = true;
  // Reports of ranks that stalled in this very collective stand; everyone else is asked now.
  for (size_t group_rank = 1; group_rank < answers_.size(); ++group_rank) {
    std::optional<ControlMessage>& answer = answers_[group_rank];
    if (answer && answer->sequence == sequence) continue;
    answer.reset();
    ControlMessage query;
    query.sequence = sequence;
    send_control(static_cast<int>(group_rank), kQuery, &query, sizeof(query));
  }
  const auto all_answered = [&] {
    return std::all_of(answers_.begin() + 1, answers_.end(),
                       [](const auto& answer) { return answer.has_value(); });
  };
  const Clock::time_point began = Clock::now();
  while (!all_answered() && seconds_since(began) < reply_grace_s()) {
    poll_control();
    poll_all_control();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  const ControlMessage own = describe(sequence);
  CallRecord call;
  call.sequence = sequence;
  call.kind = own.kind >= 0 ? static_cast<CommCall>(own.kind) : CommCall::barrier;
  call.name = own.name;
  std::vector<int> missing, arrived, mismatched;
  std::string behind_detail, mismatch_detail;
  for (int group_rank = 1; group_rank < size(); ++group_rank) {
    const std::optional<ControlMessage>& answer = answers_[static_cast<size_t>(group_rank)];
    const int world_rank = world_rank_of(group_rank);
    if (!answer || answer->latest_started < sequence) {
      missing.push_back(world_rank);
      // A rank that answered is waiting elsewhere: say where.
      if (answer) behind_detail += "; rank " + std::to_string(world_rank) + " " + describe_text(*answer);
      continue;
    }
    arrived.push_back(group_rank);
    if (answer->kind != own.kind || std::strncmp(answer->name, own.name, sizeof(own.name)) != 0) {
      mismatched.push_back(world_rank);
      mismatch_detail += ", rank " + std::to_string(world_rank) + " " + describe_text(*answer);
    }
  }
  std::string line = call_text(call);
  if (!missing.empty()) {
    line += ranks_text(missing) + " did not arrive";
    if (!behind_detail.empty()) line += " (" + behind_detail.substr(2) + ")";
  } else if (!mismatched.empty()) {
    line += "the ranks issued different collectives as #" + std::to_string(sequence) + ": rank " +
            std::to_string(world_rank_of(0)) + " " + describe_text(own) + mismatch_detail;
  } else {
    line += "every rank arrived, yet it did not complete (a rank outside this group or a stalled link)";
  }
  for (int group_rank : arrived) send_control(group_rank, kVerdict, line.data(), line.size());
  std::fprintf(stderr, "meshtrain: error: %s (reported by rank %d)\n", line.c_str(), world_rank_of(rank()));
  std::fflush(stderr);
  // Let the arrived ranks print before MPI_Abort tears the job down.
  const Clock::time_point verdict_sent = Clock::now();
  while (acknowledgements_ < static_cast<int>(arrived.size()) && seconds_since(verdict_sent) < 2.0) {
    poll_control();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  abort_job(1);
}

void MpiCommunicator::on_timeout(const CallRecord& call) {
  if (call.kind == CommCall::send || call.kind == CommCall::recv) {
    print_and_abort(call_text(call) + "rank " + std::to_string(world_rank_of(call.peer)) +
                    (call.kind == CommCall::send ? " did not post the matching recv"
                                                 : " did not post the matching send"));
  }
  if (rank() == 0) investigate(call.sequence);
  const ControlMessage stalled = describe(call.sequence);
  send_control(0, kStalled, &stalled, sizeof(stalled));
  // The coordinator answers within its reply grace; give it that twice over before concluding it is gone.
  const Clock::time_point began = Clock::now();
  while (seconds_since(began) < 2.0 * reply_grace_s() + 2.0) {
    poll_control();
    poll_all_control();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  print_and_abort(call_text(call) + "rank " + std::to_string(world_rank_of(0)) +
                  " did not arrive (it coordinates this group's timeout check, so other ranks that did not "
                  "arrive are not known)");
}

}  // namespace

namespace {

std::unique_ptr<Communicator> dup_world(double collective_timeout_s) {
  MPI_Comm world;
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  return std::make_unique<MpiCommunicator>(world, "world", collective_timeout_s,
                                           std::make_shared<std::string>());
}

// OpenMPI 4.1's mpirun can hang or crash when one rank calls MPI_Abort while others sit in MPI_Finalize
// (reproduced with a plain MPI program). So at exit every rank first meets the others in a barrier under
// the timeout: a rank that aborts meanwhile finds them in an ordinary MPI call, where the abort works.
Communicator* finalize_world = nullptr;

void finalize_barrier() {
  finalize_world->barrier("finalize");
  delete finalize_world;
  finalize_world = nullptr;
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_world_communicator(double collective_timeout_s) {
  if (!(collective_timeout_s > 0.0)) {
    fail("collective_timeout_s", "a positive number of seconds", to_text(collective_timeout_s),
         "set collective_timeout_s=300 (or more for very large models)");
  }
  MpiRuntime::instance();
  if (finalize_world == nullptr) {
    finalize_world = dup_world(collective_timeout_s).release();
    // Registered after the runtime was constructed, so it runs before the runtime's MPI_Finalize.
    std::atexit(finalize_barrier);
  }
  return dup_world(collective_timeout_s);
}

namespace testing {
void set_mpi_max_chunk_elements(int64_t elements) {
  MT_CHECK(elements >= 1 && elements <= INT_MAX, std::to_string(elements));
  max_chunk_elements = elements;
}
}  // namespace testing

}  // namespace meshtrain
