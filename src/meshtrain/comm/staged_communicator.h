// Collectives over device memory staged through host memory: a decorator around another communicator
// (MPI), for several processes sharing one GPU (share_gpus=true), where NCCL refuses to run. Each call
// copies its device inputs to host buffers (the copy waits for the kernels queued before it), runs the
// wrapped communicator's call on the host buffers, and copies the results back to the device when the call
// completes (wait() or a test() that finds it done). Host buffers (the loss sums, flags and hashes) pass
// through untouched. The bytes counted are the calls' own (the same as the wrapped communicator would count
// for the device buffers); timeouts and the failure messages are the wrapped communicator's.
#pragma once

#include <cstddef>
#include <memory>

#include "meshtrain/comm/communicator.h"

namespace meshtrain {

// What staging needs of the device's memory: the kernel table's memory entries (kernels/backend.h), passed
// as plain functions because comm looks only down to core.
struct DeviceMemoryAccess {
  bool (*is_device)(const void* pointer);  // true: the host may not read or write it in place
  void (*copy_in)(void* device, const void* host, size_t bytes);
  void (*copy_out)(void* host, const void* device, size_t bytes);  // finished when it returns
};

// `inner` staged through host memory; its splits are staged alike.
std::unique_ptr<Communicator> stage_through_host(std::unique_ptr<Communicator> inner,
                                                 DeviceMemoryAccess memory);

}  // namespace meshtrain
