// Open MPI hostfiles for `meshtrain launch --mpirun`: read (`host [slots=N] [max_slots=N]`, # comments,
// blank lines) and checked before anything starts: enough hosts and slots for the ranks, every host name
// resolving, and every host that is not this machine answering on its ssh port (mpirun starts its daemons
// there over ssh).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

struct HostfileHost {
  std::string host;    // as written, without a user@ prefix
  int64_t line = 0;    // its first line (1-based)
  int64_t slots = -1;  // the slots its lines give; -1: not given (mpirun counts the host's cores)
};

// The distinct hosts of the file in order of first appearance (a host on several lines adds up its slots,
// as mpirun does). An unreadable file, an unknown word or a bad slot count is a MeshError naming the line.
std::vector<HostfileHost> read_hostfile(const std::string& path);

// --nodes N --tasks-per-node T over a hostfile: the first N hosts of the file, T ranks on each. Fewer hosts,
// a host with fewer than T slots, a name that does not resolve and a host other than this machine whose TCP
// port `ssh_port` refuses or does not answer within `connect_timeout_seconds` are MeshErrors naming the
// hostfile, the line, the host, what was tried and the fix.
void check_hostfile_hosts(const std::string& path, const std::vector<HostfileHost>& hosts, int64_t nodes,
                          int64_t tasks_per_node, int ssh_port, int connect_timeout_seconds);

}  // namespace meshtrain
