// Topology catalog: reads configs/topologies.yaml and an optional user file in the same format (described at
// the top of that YAML), resolves a name such as `h100x64` or `v5p-8` to per-device figures, and answers
// which memory a rank may use and which link a collective crosses.
#include "meshtrain/plan/topology.h"

#include <sched.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

constexpr double kBytesPerGB = 1e9;
constexpr double kBytesPerGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kFlopsPerTeraflop = 1e12;
constexpr double kPerGiga = 1e9;
constexpr size_t kMaxCountDigits = 9;  // keeps count arithmetic far from overflow; no cluster is near 1e9
const std::string kThisMachine = "this_machine";
const std::string kFormatHint = "the format is described at the top of configs/topologies.yaml";

const std::vector<std::string>& entry_fields() {
  static const std::vector<std::string> fields = {
      "device_kind",   "num_devices",          "devices_per_host",     "count_per_device",
      "memory_gb",     "memory_gib",           "host_memory_shared",   "host_cores",
      "peak_tflops",   "memory_bandwidth_gbs", "intra_host_link_gbs",  "inter_host_link_gbs",
      "matmul_tflops", "attention_tflops",     "loss_softmax_glogits", "elementwise_gbs"};
  return fields;
}

// One catalog entry, read and checked. A family (name ending in N) gets its device count from the name asked.
struct CatalogEntry {
  std::string key;     // "h100xN" or "cpu"
  std::string source;  // the file it came from
  bool is_family = false;
  int64_t count_per_device = 1;  // family: how much of N one device is (v5p: 2 TensorCores per chip)
  Topology topology;
};

std::string family_prefix(const CatalogEntry& entry) {
  return entry.key.substr(0, entry.key.size() - 1);
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : ", ") + item;
  return text;
}

std::string found_text(const YAML::Node& value) {
  if (!value) return "nothing (the field is missing)";
  if (value.IsScalar()) return "'" + value.Scalar() + "'";
  if (value.IsMap()) return "a map";
  if (value.IsSequence()) return "a list";
  return "an empty value";
}

[[noreturn]] void fail_field(const std::string& where, const std::string& field, const std::string& expected,
                             const YAML::Node& value) {
  fail(where + ", field '" + field + "'", expected, found_text(value), kFormatHint);
}

bool is_this_machine(const YAML::Node& value) {
  return value && value.IsScalar() && value.Scalar() == kThisMachine;
}

double positive_number(const YAML::Node& value, const std::string& where, const std::string& field,
                       const std::string& meaning) {
  double number = 0.0;
  if (!value || !value.IsScalar() || !YAML::convert<double>::decode(value, number) ||
      !std::isfinite(number) || number <= 0.0) {
    fail_field(where, field, meaning + ": a positive number", value);
  }
  return number;
}

int64_t whole_number(const YAML::Node& value, const std::string& where, const std::string& field,
                     const std::string& meaning, int64_t minimum) {
  int64_t number = 0;
  if (!value || !value.IsScalar() || !YAML::convert<int64_t>::decode(value, number) || number < minimum) {
    fail_field(where, field, meaning + ": a whole number >= " + std::to_string(minimum), value);
  }
  return number;
}

bool flag(const YAML::Node& value, const std::string& where, const std::string& field) {
  bool result = false;
  if (!value.IsScalar() || !YAML::convert<bool>::decode(value, result)) {
    fail_field(where, field, "true or false", value);
  }
  return result;
}

std::string text(const YAML::Node& value, const std::string& where, const std::string& field,
                 const std::string& meaning) {
  if (!value || !value.IsScalar() || value.Scalar().empty()) fail_field(where, field, meaning, value);
  return value.Scalar();
}

void reject_unknown_fields(const YAML::Node& map, const std::string& where,
                           const std::vector<std::string>& known) {
  for (const auto& field : map) {
    const std::string name = field.first.Scalar();
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    fail(where + ", field '" + name + "'", "one of the fields " + join(known), "an unknown field",
         "did you mean '" + closest_name(name, known) + "'?");
  }
}

// A rate per compute dtype, `{float32: <number>, bfloat16: <number>}`, both positive.
std::pair<double, double> per_dtype(const YAML::Node& value, const std::string& where,
                                    const std::string& field, const std::string& meaning) {
  if (!value || !value.IsMap()) {
    fail_field(where, field, meaning + " per dtype: {float32: <number>, bfloat16: <number>}", value);
  }
  reject_unknown_fields(value, where + ", field '" + field + "'", {"float32", "bfloat16"});
  return {positive_number(value["float32"], where, field + ".float32", "float32 " + meaning),
          positive_number(value["bfloat16"], where, field + ".bfloat16", "bfloat16 " + meaning)};
}

// The cores this process may run on (its affinity mask, as a container or taskset limits it).
int64_t machine_core_count() {
#ifdef __linux__
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) > 0)
    return CPU_COUNT(&allowed);
#endif
  return std::max<int64_t>(1, std::thread::hardware_concurrency());
}

double machine_memory_bytes(const std::string& where) {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) {
    fail(where, "this machine's total memory from sysconf(_SC_PHYS_PAGES)", "no answer",
         "state the memory in the entry, e.g. memory_gb: 64");
  }
  return static_cast<double>(pages) * static_cast<double>(page_size);
}

double memory_bytes_of(const YAML::Node& entry, const std::string& where) {
  const bool in_gb = static_cast<bool>(entry["memory_gb"]);
  const bool in_gib = static_cast<bool>(entry["memory_gib"]);
  if (in_gb == in_gib) {
    fail(where + ", field 'memory_gb' or 'memory_gib'",
         "exactly one of them: memory per device in decimal GB or in GiB, or " + kThisMachine,
         in_gb ? "both" : "neither", kFormatHint);
  }
  const std::string field = in_gb ? "memory_gb" : "memory_gib";
  if (is_this_machine(entry[field])) return machine_memory_bytes(where);
  return positive_number(
             entry[field], where, field,
             "memory per device in " + std::string(in_gb ? "decimal GB" : "GiB") + " or " + kThisMachine) *
         (in_gb ? kBytesPerGB : kBytesPerGiB);
}

CatalogEntry read_entry(const std::string& key, const YAML::Node& node, const std::string& source) {
  const std::string where = source + ", topology '" + key + "'";
  if (!node.IsMap()) {
    fail(where, "a map of fields (device_kind, memory_gb, peak_tflops, ...)", found_text(node), kFormatHint);
  }
  reject_unknown_fields(node, where, entry_fields());

  CatalogEntry entry;
  entry.key = key;
  entry.source = source;
  entry.is_family = key.size() > 1 && key.back() == 'N';
  Topology& topology = entry.topology;
  topology.name = key;
  topology.device_kind = text(node["device_kind"], where, "device_kind", "a short device name, e.g. h100");

  if (entry.is_family) {
    if (node["num_devices"]) {
      fail_field(where, "num_devices",
                 "no num_devices in a family (a name ending in N takes its count from N)",
                 node["num_devices"]);
    }
    if (node["count_per_device"]) {
      entry.count_per_device =
          whole_number(node["count_per_device"], where, "count_per_device", "how much of N one device is", 1);
    }
  } else {
    if (node["count_per_device"]) {
      fail_field(where, "count_per_device", "count_per_device only in a family (a name ending in N)",
                 node["count_per_device"]);
    }
    topology.num_devices = whole_number(node["num_devices"], where, "num_devices",
                                        "the device count, or 0 for as many as the mesh asks on one host", 0);
  }

  // devices_per_host 0 stands for "every device on one host", whatever the count (num_devices: 0).
  const bool any_count_one_host = !entry.is_family && topology.num_devices == 0;
  if (any_count_one_host) {
    if (node["devices_per_host"]) {
      fail_field(where, "devices_per_host",
                 "no devices_per_host with num_devices: 0 (all devices are on one host)",
                 node["devices_per_host"]);
    }
    topology.devices_per_host = 0;
  } else {
    topology.devices_per_host =
        whole_number(node["devices_per_host"], where, "devices_per_host", "devices sharing a host", 1);
  }

  topology.memory_bytes = memory_bytes_of(node, where);
  if (node["host_memory_shared"]) {
    topology.host_memory_shared = flag(node["host_memory_shared"], where, "host_memory_shared");
  }
  if (node["host_cores"]) {
    topology.host_cores = is_this_machine(node["host_cores"])
                              ? machine_core_count()
                              : whole_number(node["host_cores"], where, "host_cores",
                                             "CPU cores of a host, or " + kThisMachine, 1);
  }

  const std::pair<double, double> peaks =
      per_dtype(node["peak_tflops"], where, "peak_tflops", "dense GEMM TFLOP/s per device");
  topology.float32.peak_flops = peaks.first * kFlopsPerTeraflop;
  topology.bfloat16.peak_flops = peaks.second * kFlopsPerTeraflop;
  // Optional (files written before they existed load as before): matmuls and attention at the GEMM peaks,
  // the loss's softmax not priced.
  const std::pair<double, double> matmul =
      node["matmul_tflops"] ? per_dtype(node["matmul_tflops"], where, "matmul_tflops",
                                        "dense matmul TFLOP/s at a model's shapes per device")
                            : peaks;
  topology.float32.matmul_flops = matmul.first * kFlopsPerTeraflop;
  topology.bfloat16.matmul_flops = matmul.second * kFlopsPerTeraflop;
  const std::pair<double, double> attention =
      node["attention_tflops"]
          ? per_dtype(node["attention_tflops"], where, "attention_tflops", "attention TFLOP/s per device")
          : peaks;
  topology.float32.attention_flops = attention.first * kFlopsPerTeraflop;
  topology.bfloat16.attention_flops = attention.second * kFlopsPerTeraflop;
  if (node["loss_softmax_glogits"]) {
    const std::pair<double, double> softmax =
        per_dtype(node["loss_softmax_glogits"], where, "loss_softmax_glogits",
                  "billions of logits per second through the loss's softmax per device");
    topology.float32.loss_softmax_logits = softmax.first * kPerGiga;
    topology.bfloat16.loss_softmax_logits = softmax.second * kPerGiga;
  }
  topology.memory_bandwidth = positive_number(node["memory_bandwidth_gbs"], where, "memory_bandwidth_gbs",
                                              "memory bandwidth per device in GB/s") *
                              kBytesPerGB;
  // Optional as the rates above: elementwise ops at the memory bandwidth.
  const std::pair<double, double> elementwise =
      node["elementwise_gbs"] ? per_dtype(node["elementwise_gbs"], where, "elementwise_gbs",
                                          "GB/s the elementwise ops move per device")
                              : std::pair<double, double>{topology.memory_bandwidth / kBytesPerGB,
                                                          topology.memory_bandwidth / kBytesPerGB};
  topology.float32.elementwise_bandwidth = elementwise.first * kBytesPerGB;
  topology.bfloat16.elementwise_bandwidth = elementwise.second * kBytesPerGB;
  topology.intra_host_bandwidth =
      positive_number(node["intra_host_link_gbs"], where, "intra_host_link_gbs",
                      "link bandwidth per device per direction within a host, in GB/s") *
      kBytesPerGB;
  const bool one_host =
      any_count_one_host || (!entry.is_family && topology.num_devices <= topology.devices_per_host);
  if (!one_host || node["inter_host_link_gbs"]) {
    topology.inter_host_bandwidth =
        positive_number(node["inter_host_link_gbs"], where, "inter_host_link_gbs",
                        "link bandwidth per device per direction between hosts, in GB/s") *
        kBytesPerGB;
  }
  return entry;
}

std::vector<CatalogEntry> read_catalog_file(const std::string& path, bool is_user_file) {
  const std::string path_hint = is_user_file ? "check the config key topologies_path" : "";
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    fail(path, "a readable YAML topology catalog", "no readable file", path_hint);
  } catch (const YAML::Exception& error) {
    fail(path, "a YAML topology catalog", std::string("invalid YAML: ") + error.what(), kFormatHint);
  }
  if (!root.IsMap()) fail(path, "a map from topology names to their fields", found_text(root), kFormatHint);

  std::vector<CatalogEntry> entries;
  std::set<std::string> seen;
  for (const auto& item : root) {
    const std::string key = item.first.Scalar();
    if (key.empty() || key.find_first_of(" \t") != std::string::npos) {
      fail(path + ", topology '" + key + "'", "a name without spaces (e.g. mygpuxN or mycluster)",
           "'" + key + "'", kFormatHint);
    }
    if (!seen.insert(key).second)
      fail(path, "each topology name once", "'" + key + "' twice", "remove one of them");
    entries.push_back(read_entry(key, item.second, path));
  }
  return entries;
}

// read_catalog_file, parsed once per process while the file keeps its modification time and size: every
// plan resolves its topology, and a search plans thousands (a pipeline candidate one per stage), where
// parsing the YAML again each time was about a sixth of the search's time. A file that cannot be read is
// read (and reported) as before.
std::vector<CatalogEntry> read_catalog_file_once(const std::string& path, bool is_user_file) {
  namespace fs = std::filesystem;
  std::error_code time_error, size_error;
  const fs::file_time_type modified = fs::last_write_time(path, time_error);
  const uintmax_t size = fs::file_size(path, size_error);
  if (time_error || size_error) return read_catalog_file(path, is_user_file);
  struct Parsed {
    fs::file_time_type modified;
    uintmax_t size = 0;
    std::vector<CatalogEntry> entries;
  };
  static std::mutex mutex;
  static std::map<std::pair<std::string, bool>, Parsed> parsed;
  const std::pair<std::string, bool> key{path, is_user_file};
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = parsed.find(key);
    if (found != parsed.end() && found->second.modified == modified && found->second.size == size)
      return found->second.entries;
  }
  std::vector<CatalogEntry> entries = read_catalog_file(path, is_user_file);
  const std::lock_guard<std::mutex> lock(mutex);
  parsed[key] = {modified, size, entries};
  return entries;
}

// The built-in catalog, then the user's: a user entry replaces the built-in one of the same name in place.
std::vector<CatalogEntry> read_catalog(const std::string& user_catalog, const std::string& config_dir) {
  const std::string dir = config_dir.empty() ? config_directory() : config_dir;
  std::vector<CatalogEntry> catalog = read_catalog_file_once(dir + "/topologies.yaml", false);
  if (user_catalog.empty()) return catalog;
  for (CatalogEntry& user_entry : read_catalog_file_once(user_catalog, true)) {
    const auto same_name = std::find_if(catalog.begin(), catalog.end(), [&](const CatalogEntry& entry) {
      return entry.key == user_entry.key;
    });
    if (same_name == catalog.end()) {
      catalog.push_back(std::move(user_entry));
    } else {
      *same_name = std::move(user_entry);
    }
  }
  return catalog;
}

// Valid device counts: part of one host, or whole hosts.
bool is_valid_device_count(int64_t devices, int64_t devices_per_host) {
  return devices >= 1 && (devices <= devices_per_host || devices % devices_per_host == 0);
}

// The valid counts N of a family, in words.
std::string count_rule(const CatalogEntry& family) {
  const int64_t per_host = family.topology.devices_per_host;
  const std::string host_rule =
      per_host == 1 ? "any whole number >= 1"
                    : "1.." + std::to_string(per_host) + " or a multiple of " + std::to_string(per_host);
  if (family.count_per_device == 1) return "N = " + host_rule;
  const std::string per_device = std::to_string(family.count_per_device);
  return "N a multiple of " + per_device + "; N/" + per_device + " devices = " + host_rule;
}

std::string name_form(const CatalogEntry& entry) {
  return entry.is_family ? entry.key + " (" + count_rule(entry) + ")" : entry.key;
}

// The valid counts nearest below and above `count` (either may be absent), as names.
std::string nearest_valid_names(const CatalogEntry& family, int64_t count) {
  const int64_t per_device = family.count_per_device, per_host = family.topology.devices_per_host;
  const int64_t below = count / per_device;                                           // devices, rounded down
  const int64_t above = std::max<int64_t>(1, (count + per_device - 1) / per_device);  // rounded up
  const int64_t lower = below <= per_host ? below : below / per_host * per_host;
  const int64_t upper = above <= per_host ? above : (above + per_host - 1) / per_host * per_host;
  std::vector<std::string> names;
  if (lower >= 1) names.push_back(family_prefix(family) + std::to_string(lower * per_device));
  if (upper != lower) names.push_back(family_prefix(family) + std::to_string(upper * per_device));
  return names.size() == 1 ? names[0] : names[0] + " or " + names[1];
}

bool all_digits(const std::string& word) {
  return !word.empty() && std::all_of(word.begin(), word.end(), [](char c) { return c >= '0' && c <= '9'; });
}

[[noreturn]] void fail_unknown_name(const std::string& name, const std::vector<CatalogEntry>& catalog,
                                    const std::string& user_catalog) {
  // Suggest concrete names: a family with one host's count, or with the user's digits (mi300x16 ->
  // mi300xx16).
  size_t digits_start = name.size();
  while (digits_start > 0 && name[digits_start - 1] >= '0' && name[digits_start - 1] <= '9') --digits_start;
  const std::string digits = name.substr(digits_start);
  std::vector<std::string> candidates, forms;
  for (const CatalogEntry& entry : catalog) {
    forms.push_back(name_form(entry));
    if (!entry.is_family) {
      candidates.push_back(entry.key);
    } else {
      const std::string one_host = std::to_string(entry.topology.devices_per_host * entry.count_per_device);
      candidates.push_back(family_prefix(entry) + one_host);
      if (!digits.empty()) candidates.push_back(family_prefix(entry) + digits);
    }
  }
  const std::string sources = "configs/topologies.yaml" + (user_catalog.empty() ? "" : " or " + user_catalog);
  fail("config key 'topology'", "a topology name: " + join(forms), "'" + name + "' (not in " + sources + ")",
       "did you mean '" + closest_name(name, candidates) +
           "'? Other hardware can be added in a YAML file named by the config key topologies_path");
}

}  // namespace

double Topology::device_memory_bytes(int64_t devices) const {
  MT_CHECK(devices > 0, "device count " + std::to_string(devices));
  if (!host_memory_shared) return memory_bytes;
  const int64_t ranks_on_host = devices_per_host == 0 ? devices : std::min(devices, devices_per_host);
  return memory_bytes / static_cast<double>(ranks_on_host);
}

double Topology::link_bandwidth(int64_t group_size, int64_t stride) const {
  MT_CHECK(group_size > 0 && stride > 0,
           "group_size " + std::to_string(group_size) + ", stride " + std::to_string(stride));
  if (group_size == 1) return intra_host_bandwidth;
  const bool one_host = devices_per_host == 0 || (num_devices > 0 && num_devices <= devices_per_host);
  // Groups of this axis tile blocks of stride * group_size consecutive devices; every block stays inside a
  // host only when the block size divides devices_per_host (a collective is as slow as its slowest group).
  const int64_t block = stride * group_size;
  const bool within_host = one_host || (block <= devices_per_host && devices_per_host % block == 0);
  return within_host ? intra_host_bandwidth : inter_host_bandwidth;
}

std::vector<std::string> topology_names(const std::string& user_catalog, const std::string& config_dir) {
  std::vector<std::string> names;
  for (const CatalogEntry& entry : read_catalog(user_catalog, config_dir)) names.push_back(name_form(entry));
  return names;
}

Topology load_topology(const std::string& name, const std::string& user_catalog,
                       const std::string& config_dir) {
  const std::vector<CatalogEntry> catalog = read_catalog(user_catalog, config_dir);
  for (const CatalogEntry& entry : catalog) {
    if (!entry.is_family && entry.key == name) return entry.topology;
  }

  // A family whose prefix is followed by digits only; the longest prefix wins should two match.
  const CatalogEntry* family = nullptr;
  for (const CatalogEntry& entry : catalog) {
    const std::string prefix = family_prefix(entry);
    if (entry.is_family && name.starts_with(prefix) && all_digits(name.substr(prefix.size())) &&
        (!family || prefix.size() > family_prefix(*family).size())) {
      family = &entry;
    }
  }
  if (!family) fail_unknown_name(name, catalog, user_catalog);

  const std::string digits = name.substr(family_prefix(*family).size());
  const std::string expected = family->key + " with " + count_rule(*family) + " (" +
                               std::to_string(family->topology.devices_per_host) +
                               " devices per host: beyond one host, whole hosts)";
  if (digits.size() > kMaxCountDigits) fail("config key 'topology'", expected, "'" + name + "' (too large)");
  const int64_t count = std::stoll(digits);
  const int64_t devices = count / family->count_per_device;
  if (count % family->count_per_device != 0 ||
      !is_valid_device_count(devices, family->topology.devices_per_host)) {
    fail("config key 'topology'", expected, "'" + name + "'", "use " + nearest_valid_names(*family, count));
  }
  Topology topology = family->topology;
  topology.name = name;
  topology.num_devices = devices;
  return topology;
}

}  // namespace meshtrain
