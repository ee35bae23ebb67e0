#include "tessera/metrics/device_families.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <locale>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"
#include "prometheus/text_serializer.h"

namespace tessera::metrics {
namespace {

constexpr double kBytesPerMiB = 1048576.0;
constexpr std::string_view kZone = "vGPU";

void SetInt(std::string& out, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.assign(buf, r.ptr);
}

// Builds one family at a time as prometheus::MetricFamily values and serialises it with
// prometheus::TextSerializer in chunks of kChunk samples, so memory stays bounded whatever the
// cluster size. The samples' storage (label strings included) is reused from chunk to chunk.
// A family with no samples is not written (client_golang leaves such families out too); the
// HELP/TYPE header is written once, before the first chunk.
class TextChunker {
 public:
  static constexpr size_t kChunk = 2048;

  explicit TextChunker(absl::FunctionRef<void(std::string_view)> sink) : sink_(sink) {
    out_.imbue(std::locale::classic());
  }

  // Starts family `name`; `labels` are its label names in output order, the last one "zone".
  void Begin(std::string_view name, std::string_view help,
             std::initializer_list<std::string_view> labels) {
    family_.name.assign(name);
    family_.help.assign(help);
    family_.type = prometheus::MetricType::Gauge;
    labels_.assign(labels.begin(), labels.end());
    for (prometheus::ClientMetric& m : family_.metric) {
      SetNames(m);
    }
    n_ = 0;
    written_header_ = false;
  }

  // The next sample: its label names are set (and zone's value); the caller fills the other
  // label values and gauge.value.
  prometheus::ClientMetric& Next() {
    if (n_ == kChunk) {
      Flush();
    }
    if (n_ == family_.metric.size()) {
      family_.metric.emplace_back();
      SetNames(family_.metric.back());
    }
    return family_.metric[n_++];
  }

  void End() {
    if (n_ > 0) {
      Flush();
    }
  }

 private:
  void SetNames(prometheus::ClientMetric& m) const {
    m.label.resize(labels_.size());
    for (size_t i = 0; i < labels_.size(); ++i) {
      m.label[i].name.assign(labels_[i]);
    }
    m.label.back().value.assign(kZone);
  }

  void Flush() {
    if (n_ < family_.metric.size()) {
      family_.metric.resize(n_);
    }
    out_.str(std::string());
    out_.clear();
    serializer_.Serialize(out_, families_);
    std::string_view piece = out_.view();
    if (written_header_) {
      // Drop the "# HELP" and "# TYPE" lines the serializer repeats for every chunk. Neither
      // can contain a raw newline (the serializer escapes them in HELP).
      for (int lines = 0; lines < 2 && !piece.empty() && piece.front() == '#'; ++lines) {
        const size_t nl = piece.find('\n');
        piece.remove_prefix(nl == std::string_view::npos ? piece.size() : nl + 1);
      }
    }
    written_header_ = true;
    sink_(piece);
    n_ = 0;
  }

  absl::FunctionRef<void(std::string_view)> sink_;
  prometheus::TextSerializer serializer_;
  std::ostringstream out_;
  std::vector<prometheus::MetricFamily> families_ = std::vector<prometheus::MetricFamily>(1);
  prometheus::MetricFamily& family_ = families_.front();
  std::vector<std::string_view> labels_;
  size_t n_ = 0;
  bool written_header_ = false;
};

bool IsAmd(const std::string& type) { return type.rfind("AMD", 0) == 0; }

// HAMi HEAD normalises AMD core figures to percent of the device.
double CoreLimit(const device::DeviceInfo& d) { return IsAmd(d.type) ? 100.0 : d.devcore; }
double CoreAllocated(const device::DeviceInfo& d, int64_t usedcores) {
  if (!IsAmd(d.type)) {
    return static_cast<double>(usedcores);
  }
  if (d.devcore <= 0) {
    return 0.0;
  }
  return std::ceil(static_cast<double>(usedcores) / d.devcore * 100.0);
}

// One pod's collapsed share of one device (ledger counting rule 5).
struct PodShare {
  const ledger::Holder* first = nullptr;  // uid, ns, name of the pod
  int64_t usedmem = 0;
  int64_t usedcores = 0;
};

// Calls fn(node name, device, share) for every (pod, device) pair that holds.
template <typename Fn>
void ForEachPodShare(const ledger::FullSnapshot& snapshot, Fn&& fn) {
  for (const ledger::NodeView& view : snapshot.nodes) {
    if (view.devices == nullptr) {
      continue;
    }
    const auto& devices = view.devices->devices;
    const size_t n = std::min(devices.size(), view.holders.size());
    for (size_t d = 0; d < n; ++d) {
      const std::vector<ledger::Holder>& hs = view.holders[d];
      for (size_t i = 0; i < hs.size();) {
        size_t j = i;
        int64_t app_mem = 0, app_cores = 0, init_mem = 0, init_cores = 0;
        for (; j < hs.size() && hs[j].uid == hs[i].uid; ++j) {
          if (hs[j].init) {
            init_mem = std::max<int64_t>(init_mem, hs[j].usedmem);
            init_cores = std::max<int64_t>(init_cores, hs[j].usedcores);
          } else {
            app_mem += hs[j].usedmem;
            app_cores += hs[j].usedcores;
          }
        }
        fn(view.devices->node, devices[d],
           PodShare{&hs[i], std::max(init_mem, app_mem), std::max(init_cores, app_cores)});
        i = j;
      }
    }
  }
}

// Calls fn(node name, device, usage) for every registered device.
template <typename Fn>
void ForEachDevice(const ledger::FullSnapshot& snapshot, Fn&& fn) {
  static const device::DeviceUsage kZero;
  for (const ledger::NodeView& view : snapshot.nodes) {
    if (view.devices == nullptr) {
      continue;
    }
    const auto& devices = view.devices->devices;
    for (size_t d = 0; d < devices.size(); ++d) {
      fn(view.devices->node, devices[d], d < view.usage.size() ? view.usage[d] : kZero);
    }
  }
}

// Label names in sorted order (as client_golang writes them); `zone` is always last and is
// filled in by the chunker.
using Labels = std::initializer_list<std::string_view>;

// The label positions of each family shape, matching the Labels lists below.
// Device families, HEAD names.
const Labels kDeviceLabels = {"device_index", "device_type", "device_uuid", "node", "zone"};
const Labels kDeviceCoresLabels = {"device_cores", "device_index", "device_type",
                                   "device_uuid",  "node",         "zone"};
const Labels kOverviewLabels = {"device_cores", "device_index", "device_memory_limit",
                                "device_type",  "device_uuid",  "node",
                                "zone"};
const Labels kPodLabels = {"container_index", "device_uuid", "namespace", "node", "pod", "zone"};
// Legacy names.
const Labels kLegacyDeviceLabels = {"deviceidx", "devicetype", "deviceuuid", "nodeid", "zone"};
const Labels kLegacyDeviceCoresLabels = {"devicecores", "deviceidx", "devicetype",
                                         "deviceuuid",  "nodeid",    "zone"};
const Labels kLegacyOverviewLabels = {
    "devicecores", "deviceidx", "devicememorylimit", "devicetype", "deviceuuid", "nodeid", "zone"};
const Labels kLegacyPercentLabels = {"deviceidx", "deviceuuid", "nodeid", "zone"};
const Labels kLegacyPodLabels = {"containeridx", "deviceuuid",   "nodename",
                                 "podname",      "podnamespace", "zone"};

enum class Value {
  kMemLimit,
  kCoreLimit,
  kCoreLimitRaw,
  kMemAllocated,
  kShared,
  kCoreAllocated,
  kCoreAllocatedRaw,
  kMemRatio,
};

// A device family: how its labels are filled and what its value is.
enum class DeviceShape {
  kPlain,
  kCores,
  kOverview,
  kLegacyPlain,
  kLegacyCores,
  kLegacyOverview,
  kLegacyPercent
};

struct DeviceFamily {
  std::string_view name;
  std::string_view help;
  DeviceShape shape;
  Value value;
};

struct PodFamily {
  std::string_view name;
  std::string_view help;
  bool legacy;
  bool memory;  // memory bytes, else cores
};

const Labels& LabelsOf(DeviceShape s) {
  switch (s) {
    case DeviceShape::kPlain:
      return kDeviceLabels;
    case DeviceShape::kCores:
      return kDeviceCoresLabels;
    case DeviceShape::kOverview:
      return kOverviewLabels;
    case DeviceShape::kLegacyPlain:
      return kLegacyDeviceLabels;
    case DeviceShape::kLegacyCores:
      return kLegacyDeviceCoresLabels;
    case DeviceShape::kLegacyOverview:
      return kLegacyOverviewLabels;
    case DeviceShape::kLegacyPercent:
      return kLegacyPercentLabels;
  }
  return kDeviceLabels;
}

// Fills the label values of one device sample (all but zone).
void FillDeviceLabels(DeviceShape s, const std::string& node, const device::DeviceInfo& d,
                      std::vector<prometheus::ClientMetric::Label>& l) {
  switch (s) {
    case DeviceShape::kPlain:
    case DeviceShape::kLegacyPlain:
      SetInt(l[0].value, d.index);
      l[1].value.assign(d.type);
      l[2].value.assign(d.id);
      l[3].value.assign(node);
      return;
    case DeviceShape::kCores:
    case DeviceShape::kLegacyCores:
      SetInt(l[0].value, d.devcore);
      SetInt(l[1].value, d.index);
      l[2].value.assign(d.type);
      l[3].value.assign(d.id);
      l[4].value.assign(node);
      return;
    case DeviceShape::kOverview:
    case DeviceShape::kLegacyOverview:
      SetInt(l[0].value, d.devcore);
      SetInt(l[1].value, d.index);
      SetInt(l[2].value, d.devmem);
      l[3].value.assign(d.type);
      l[4].value.assign(d.id);
      l[5].value.assign(node);
      return;
    case DeviceShape::kLegacyPercent:
      SetInt(l[0].value, d.index);
      l[1].value.assign(d.id);
      l[2].value.assign(node);
      return;
  }
}

// Returns false when the family has no sample for this device.
bool DeviceValue(Value v, const device::DeviceInfo& d, const device::DeviceUsage& u, double* out) {
  switch (v) {
    case Value::kMemLimit:
      *out = d.devmem * kBytesPerMiB;
      return true;
    case Value::kCoreLimit:
      *out = CoreLimit(d);
      return true;
    case Value::kCoreLimitRaw:
      *out = d.devcore;
      return true;
    case Value::kMemAllocated:
      *out = static_cast<double>(u.usedmem) * kBytesPerMiB;
      return true;
    case Value::kShared:
      *out = u.used;
      return true;
    case Value::kCoreAllocated:
      *out = CoreAllocated(d, u.usedcores);
      return true;
    case Value::kCoreAllocatedRaw:
      *out = static_cast<double>(u.usedcores);
      return true;
    case Value::kMemRatio:
      if (d.devmem <= 0) {
        return false;
      }
      *out = static_cast<double>(u.usedmem) / d.devmem;
      return true;
  }
  return false;
}

// HAMi v2.10's MIG families (cmd/scheduler/metrics.go collectNodeMetrics): one sample of value 1
// per realised instance (ledger::NodeView::mig).
struct MigFamily {
  std::string_view name;
  std::string_view help;
  bool legacy;
};
const Labels kMigLabels = {"compute_instance_id",
                           "device_index",
                           "device_uuid",
                           "gpu_instance_id",
                           "mig_uuid",
                           "node",
                           "placement_size",
                           "placement_start",
                           "profile",
                           "zone"};
const Labels kLegacyMigLabels = {"deviceidx", "deviceuuid", "migname", "nodeid", "zone"};
const MigFamily kMigFamily = {"hami_node_gpu_mig_instance_info",
                              "Realised MIG instance identity and scheduler placement.", false};
const MigFamily kLegacyMigFamily = {
    "nodeGPUMigInstance", "Realised MIG instance: profile-gpuInstanceID (legacy name).", true};

// Families sorted by name (ASCII: the capitalised legacy names first).
struct AnyFamily {
  const DeviceFamily* device = nullptr;
  const PodFamily* pod = nullptr;
  bool legacy = false;
  const MigFamily* mig = nullptr;
  std::string_view name() const {
    return device != nullptr ? device->name : pod != nullptr ? pod->name : mig->name;
  }
};

void RenderMigFamily(const ledger::FullSnapshot& snapshot, const MigFamily& fam,
                     TextChunker& chunker) {
  chunker.Begin(fam.name, fam.help, fam.legacy ? kLegacyMigLabels : kMigLabels);
  for (const ledger::NodeView& view : snapshot.nodes) {
    if (view.devices == nullptr) {
      continue;
    }
    const auto& devices = view.devices->devices;
    for (size_t d = 0; d < std::min(devices.size(), view.mig.size()); ++d) {
      for (const device::MigAllocation& a : view.mig[d]) {
        prometheus::ClientMetric& m = chunker.Next();
        auto& l = m.label;
        const std::string gi = std::to_string(a.gpu_instance_id.value_or(0));
        if (fam.legacy) {
          SetInt(l[0].value, devices[d].index);
          l[1].value.assign(devices[d].id);
          l[2].value.assign(a.profile + "-" + gi);
          l[3].value.assign(view.devices->node);
        } else {
          SetInt(l[0].value, a.compute_instance_id.value_or(0));
          SetInt(l[1].value, devices[d].index);
          l[2].value.assign(devices[d].id);
          l[3].value.assign(gi);
          l[4].value.assign(a.mig_uuid);
          l[5].value.assign(view.devices->node);
          SetInt(l[6].value, a.placement.size);
          SetInt(l[7].value, a.placement.start);
          l[8].value.assign(a.profile);
        }
        m.gauge.value = 1;
      }
    }
  }
  chunker.End();
}

const DeviceFamily kDeviceFamilies[] = {
    {"hami_gpu_memory_limit_bytes", "Total memory of the GPU device in bytes.", DeviceShape::kPlain,
     Value::kMemLimit},
    {"hami_gpu_core_limit_ratio", "Total compute of the GPU device in percent of one GPU.",
     DeviceShape::kPlain, Value::kCoreLimit},
    {"hami_gpu_memory_allocated_bytes", "GPU device memory allocated to pods, in bytes.",
     DeviceShape::kCores, Value::kMemAllocated},
    {"hami_gpu_shared_count", "Number of allocations sharing the GPU device.", DeviceShape::kPlain,
     Value::kShared},
    {"hami_gpu_core_allocated_ratio", "GPU device compute allocated to pods, in percent.",
     DeviceShape::kPlain, Value::kCoreAllocated},
    {"hami_node_gpu_overview", "Per-device overview of a node: allocated memory in bytes.",
     DeviceShape::kOverview, Value::kMemAllocated},
    {"hami_node_gpu_memory_allocated_ratio",
     "Fraction of the GPU device memory allocated to pods (0 to 1).", DeviceShape::kPlain,
     Value::kMemRatio},
};
const DeviceFamily kLegacyDeviceFamilies[] = {
    {"GPUDeviceMemoryLimit", "Total memory of the GPU device in bytes (legacy name).",
     DeviceShape::kLegacyPlain, Value::kMemLimit},
    {"GPUDeviceCoreLimit", "Total compute of the GPU device in percent (legacy name).",
     DeviceShape::kLegacyPlain, Value::kCoreLimitRaw},
    {"GPUDeviceMemoryAllocated", "GPU device memory allocated to pods, in bytes (legacy name).",
     DeviceShape::kLegacyCores, Value::kMemAllocated},
    {"GPUDeviceSharedNum", "Number of allocations sharing the GPU device (legacy name).",
     DeviceShape::kLegacyPlain, Value::kShared},
    {"GPUDeviceCoreAllocated", "GPU device compute allocated to pods, in percent (legacy name).",
     DeviceShape::kLegacyPlain, Value::kCoreAllocatedRaw},
    {"nodeGPUOverview", "Per-device overview of a node: allocated memory in bytes (legacy name).",
     DeviceShape::kLegacyOverview, Value::kMemAllocated},
    {"nodeGPUMemoryPercentage",
     "Fraction of the GPU device memory allocated to pods, 0 to 1 (legacy name).",
     DeviceShape::kLegacyPercent, Value::kMemRatio},
};
const PodFamily kPodFamilies[] = {
    {"hami_vgpu_memory_allocated_bytes", "GPU memory a pod holds on a device, in bytes.", false,
     true},
    {"hami_vgpu_core_allocated_ratio", "GPU compute a pod holds on a device, in percent.", false,
     false},
};
const PodFamily kLegacyPodFamilies[] = {
    {"vGPUMemoryAllocated", "GPU memory a pod holds on a device, in bytes (legacy name).", true,
     true},
    {"vGPUCoreAllocated", "GPU compute a pod holds on a device, in percent (legacy name).", true,
     false},
};

std::vector<AnyFamily> SortedFamilies(bool legacy) {
  std::vector<AnyFamily> out;
  for (const auto& f : kDeviceFamilies) {
    out.push_back({&f, nullptr, false});
  }
  for (const auto& f : kPodFamilies) {
    out.push_back({nullptr, &f, false});
  }
  out.push_back({nullptr, nullptr, false, &kMigFamily});
  if (legacy) {
    out.push_back({nullptr, nullptr, true, &kLegacyMigFamily});
    for (const auto& f : kLegacyDeviceFamilies) {
      out.push_back({&f, nullptr, true});
    }
    for (const auto& f : kLegacyPodFamilies) {
      out.push_back({nullptr, &f, true});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const AnyFamily& a, const AnyFamily& b) { return a.name() < b.name(); });
  return out;
}

}  // namespace

void RenderDeviceFamilies(const ledger::FullSnapshot& snapshot, bool legacy,
                          absl::FunctionRef<void(std::string_view)> sink) {
  TextChunker chunker(sink);
  for (const AnyFamily& f : SortedFamilies(legacy)) {
    if (f.mig != nullptr) {
      RenderMigFamily(snapshot, *f.mig, chunker);
      continue;
    }
    if (f.device != nullptr) {
      const DeviceFamily& fam = *f.device;
      chunker.Begin(fam.name, fam.help, LabelsOf(fam.shape));
      ForEachDevice(snapshot, [&](const std::string& node, const device::DeviceInfo& d,
                                  const device::DeviceUsage& u) {
        double v = 0;
        if (!DeviceValue(fam.value, d, u, &v)) {
          return;
        }
        prometheus::ClientMetric& m = chunker.Next();
        FillDeviceLabels(fam.shape, node, d, m.label);
        m.gauge.value = v;
      });
    } else {
      const PodFamily& fam = *f.pod;
      chunker.Begin(fam.name, fam.help, fam.legacy ? kLegacyPodLabels : kPodLabels);
      ForEachPodShare(
          snapshot, [&](const std::string& node, const device::DeviceInfo& d, const PodShare& s) {
            prometheus::ClientMetric& m = chunker.Next();
            auto& l = m.label;
            // container_index, device_uuid, namespace, node, pod (and the legacy equivalents
            // containeridx, deviceuuid, nodename, podname, podnamespace: note the order).
            l[0].value.assign("0");
            l[1].value.assign(d.id);
            if (fam.legacy) {
              l[2].value.assign(node);
              l[3].value.assign(s.first->name);
              l[4].value.assign(s.first->ns);
            } else {
              l[2].value.assign(s.first->ns);
              l[3].value.assign(node);
              l[4].value.assign(s.first->name);
            }
            if (fam.memory) {
              m.gauge.value = static_cast<double>(s.usedmem) * kBytesPerMiB;
            } else {
              m.gauge.value =
                  fam.legacy ? static_cast<double>(s.usedcores) : CoreAllocated(d, s.usedcores);
            }
          });
    }
    chunker.End();
  }
}

void RenderQuotaFamilies(const ledger::FullSnapshot& snapshot,
                         const std::vector<schedule::NamespaceQuota>& limits,
                         const schedule::NamespaceQuota& names, bool legacy,
                         absl::FunctionRef<void(std::string_view)> sink) {
  // One row per (namespace, resource) with the usage and the limit (if any).
  struct Row {
    std::string ns;
    const std::string* resource;
    int64_t used = 0;
    std::optional<int64_t> limit;
  };
  std::map<std::string, std::pair<const ledger::NamespaceUsage*, const schedule::NamespaceQuota*>>
      by_ns;
  for (const auto& [ns, usage] : snapshot.namespaces) {
    by_ns[ns].first = &usage;
  }
  for (const schedule::NamespaceQuota& q : limits) {
    by_ns[q.ns].second = &q;
  }
  std::vector<Row> rows;
  for (const auto& [ns, entry] : by_ns) {
    const auto [usage, quota] = entry;
    const bool holds = usage != nullptr;
    if (holds || (quota != nullptr && quota->memory)) {
      Row r{ns, &names.memory_name, holds ? usage->usedmem : 0, std::nullopt};
      if (quota != nullptr && quota->memory) {
        r.limit = quota->memory->limit;
      }
      rows.push_back(std::move(r));
    }
    if (holds || (quota != nullptr && quota->cores)) {
      Row r{ns, &names.cores_name, holds ? usage->usedcores : 0, std::nullopt};
      if (quota != nullptr && quota->cores) {
        r.limit = quota->cores->limit;
      }
      rows.push_back(std::move(r));
    }
  }
  TextChunker chunker(sink);
  // Sorted by name, like the device families: QuotaUsed, hami_resource_quota_limit, _used.
  if (legacy) {
    chunker.Begin("QuotaUsed", "GPU resources a namespace holds against its quota (legacy name).",
                  {"limit", "quotaName", "quotanamespace", "zone"});
    for (const Row& r : rows) {
      prometheus::ClientMetric& m = chunker.Next();
      m.label[0].value = std::to_string(r.limit.value_or(0));
      m.label[1].value = *r.resource;
      m.label[2].value = r.ns;
      m.gauge.value = static_cast<double>(r.used);
    }
    chunker.End();
  }
  chunker.Begin("hami_resource_quota_limit",
                "The limit a namespace's ResourceQuota sets on a GPU resource.",
                {"namespace", "quota_name", "zone"});
  for (const Row& r : rows) {
    if (r.limit) {
      prometheus::ClientMetric& m = chunker.Next();
      m.label[0].value = r.ns;
      m.label[1].value = *r.resource;
      m.gauge.value = static_cast<double>(*r.limit);
    }
  }
  chunker.End();
  chunker.Begin("hami_resource_quota_used",
                "GPU resources a namespace's pods hold (memory in MiB, cores in percent).",
                {"limit", "namespace", "quota_name", "zone"});
  for (const Row& r : rows) {
    prometheus::ClientMetric& m = chunker.Next();
    m.label[0].value = std::to_string(r.limit.value_or(0));
    m.label[1].value = r.ns;
    m.label[2].value = *r.resource;
    m.gauge.value = static_cast<double>(r.used);
  }
  chunker.End();
}

std::string RenderQuotaFamilies(const ledger::FullSnapshot& snapshot,
                                const std::vector<schedule::NamespaceQuota>& limits,
                                const schedule::NamespaceQuota& names, bool legacy) {
  std::string out;
  RenderQuotaFamilies(snapshot, limits, names, legacy,
                      [&out](std::string_view piece) { out.append(piece); });
  return out;
}

std::string RenderDeviceFamilies(const ledger::FullSnapshot& snapshot, bool legacy) {
  std::string out;
  RenderDeviceFamilies(snapshot, legacy, [&out](std::string_view piece) { out.append(piece); });
  return out;
}

}  // namespace tessera::metrics
