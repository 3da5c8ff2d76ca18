// Open MPI hostfiles (hostfile.h): read, then the hosts checked for slots, name resolution and their ssh
// port.
#include "meshtrain/launch/hostfile.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <set>
#include <sstream>

#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

std::string line_where(const std::string& path, int64_t line) {
  return "hostfile " + path + " line " + std::to_string(line);
}

std::string host_where(const std::string& path, const HostfileHost& host) {
  return line_where(path, host.line) + " host '" + host.host + "'";
}

// An address as text ("127.0.0.2", "::1").
std::string address_text(const sockaddr* address, socklen_t length) {
  char text[NI_MAXHOST] = {};
  if (::getnameinfo(address, length, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0) return "?";
  return text;
}

// This machine's own addresses (every interface's), for telling it apart from hosts mpirun reaches by ssh.
std::set<std::string> own_addresses() {
  std::set<std::string> addresses;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return addresses;
  for (const ifaddrs* entry = interfaces; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr) continue;
    const int family = entry->ifa_addr->sa_family;
    if (family == AF_INET) addresses.insert(address_text(entry->ifa_addr, sizeof(sockaddr_in)));
    if (family == AF_INET6) addresses.insert(address_text(entry->ifa_addr, sizeof(sockaddr_in6)));
  }
  ::freeifaddrs(interfaces);
  return addresses;
}

std::string own_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

// Whether a TCP connection to `address` opens within the timeout; `reason` says why not.
bool tcp_connects(const addrinfo& address, int timeout_seconds, std::string& reason) {
  const int fd =
      ::socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, address.ai_protocol);
  if (fd < 0) {
    reason = std::string("no socket: ") + std::strerror(errno);
    return false;
  }
  int err = ::connect(fd, address.ai_addr, address.ai_addrlen) == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    pollfd waiting = {fd, POLLOUT, 0};
    const int ready = ::poll(&waiting, 1, timeout_seconds * 1000);
    if (ready == 0) {
      ::close(fd);
      reason = "no answer within " + std::to_string(timeout_seconds) + " s";
      return false;
    }
    socklen_t length = sizeof(err);
    if (ready < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &length) != 0) err = errno;
  }
  ::close(fd);
  if (err != 0) reason = std::strerror(err);
  return err == 0;
}

int64_t slot_count(const std::string& path, int64_t line, const std::string& word, const std::string& text) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < 1) {
    fail(line_where(path, line), "a slot count of at least 1", "'" + word + "'", "write e.g. slots=4");
  }
  return value;
}

}  // namespace

std::vector<HostfileHost> read_hostfile(const std::string& path) {
  const std::string text =
      read_file_text(path, "Open MPI hostfile", "give --hostfile a file of lines 'HOST [slots=N]'");
  std::vector<HostfileHost> hosts;
  std::istringstream lines(text);
  std::string content;
  for (int64_t number = 1; std::getline(lines, content); ++number) {
    std::istringstream words(content.substr(0, content.find('#')));
    std::string host, word;
    if (!(words >> host)) continue;          // blank or comment
    host = host.substr(host.find('@') + 1);  // user@host: mpirun's ssh user, not part of the name
    int64_t slots = -1;
    while (words >> word) {
      const size_t equals = word.find('=');
      const std::string key = word.substr(0, equals);
      if (equals == std::string::npos || (key != "slots" && key != "max_slots" && key != "max-slots")) {
        fail(line_where(path, number), "'HOST [slots=N] [max_slots=N]' (Open MPI's hostfile syntax)",
             "'" + word + "' after host '" + host + "'", "write the slot count as slots=N");
      }
      const int64_t count = slot_count(path, number, word, word.substr(equals + 1));
      if (key == "slots") slots = count;
    }
    HostfileHost* known = nullptr;
    for (HostfileHost& listed : hosts) known = listed.host == host ? &listed : known;
    if (known == nullptr) {
      hosts.push_back({host, number, slots});
    } else if (slots > 0) {
      known->slots = known->slots < 0 ? slots : known->slots + slots;
    }
  }
  if (hosts.empty()) {
    fail("hostfile " + path, "at least one line 'HOST [slots=N]'", "no host (only blank or comment lines)",
         "list the hosts to run on, one a line");
  }
  return hosts;
}

void check_hostfile_hosts(const std::string& path, const std::vector<HostfileHost>& hosts, int64_t nodes,
                          int64_t tasks_per_node, int ssh_port, int connect_timeout_seconds) {
  if (static_cast<int64_t>(hosts.size()) < nodes) {
    fail("hostfile " + path, std::to_string(nodes) + " hosts for --nodes " + std::to_string(nodes),
         std::to_string(hosts.size()) + " host" + (hosts.size() == 1 ? "" : "s"),
         "add hosts to the file or lower --nodes to " + std::to_string(hosts.size()));
  }
  for (int64_t i = 0; i < nodes; ++i) {
    const HostfileHost& host = hosts[static_cast<size_t>(i)];
    if (host.slots >= 0 && host.slots < tasks_per_node) {
      fail(host_where(path, host),
           "at least --tasks-per-node = " + std::to_string(tasks_per_node) +
               " slots (--map-by ppr:" + std::to_string(tasks_per_node) +
               ":node puts that many ranks on each of the first " + std::to_string(nodes) + " hosts)",
           "slots=" + std::to_string(host.slots),
           "raise its slots= to " + std::to_string(tasks_per_node) +
               " if it has the cores, or lower --tasks-per-node (and raise --nodes)");
    }
  }
  const std::set<std::string> own = own_addresses();
  const std::string own_name = own_host_name();
  for (int64_t i = 0; i < nodes; ++i) {
    const HostfileHost& host = hosts[static_cast<size_t>(i)];
    // This machine by name: mpirun starts its ranks itself, with no lookup and no ssh (a minimal system
    // may not even resolve "localhost": no /etc/hosts).
    if (host.host == "localhost" || host.host == own_name ||
        host.host == own_name.substr(0, own_name.find('.')))
      continue;
    addrinfo hints = {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* resolved = nullptr;
    const int lookup = ::getaddrinfo(host.host.c_str(), std::to_string(ssh_port).c_str(), &hints, &resolved);
    if (lookup != 0) {
      fail(host_where(path, host), "a host name that resolves (getaddrinfo, as mpirun and ssh look it up)",
           std::string("getaddrinfo: ") + ::gai_strerror(lookup),
           "correct the name, add it to /etc/hosts or DNS, or write its IP address");
    }
    bool local = false;  // an address of this machine's
    std::string addresses;
    for (const addrinfo* address = resolved; address != nullptr; address = address->ai_next) {
      const std::string text = address_text(address->ai_addr, address->ai_addrlen);
      local = local || own.contains(text);
      if (addresses.find(text) == std::string::npos) addresses += (addresses.empty() ? "" : ", ") + text;
    }
    std::string reason;
    bool answers = local;
    for (const addrinfo* address = resolved; address != nullptr && !answers; address = address->ai_next)
      answers = tcp_connects(*address, connect_timeout_seconds, reason);
    ::freeaddrinfo(resolved);
    if (!answers) {
      fail(host_where(path, host),
           "a host whose ssh port answers (mpirun starts its daemons on the other hosts over ssh)",
           "TCP port " + std::to_string(ssh_port) + " of " + addresses + ": " + reason,
           "start sshd on " + host.host +
               " (or give --ssh-port where it listens on another port), check the "
               "network between the hosts, or remove the host from the file");
    }
  }
}

}  // namespace meshtrain
