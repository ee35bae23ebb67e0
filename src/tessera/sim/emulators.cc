#include "tessera/sim/emulators.h"

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/base/status_macros.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/device/mig.h"

namespace tessera::sim {

using nlohmann::json;

kube::DoOptions QuickRetry() {
  kube::DoOptions o;
  o.retry.max_attempts = 3;
  o.retry.backoff = {absl::Milliseconds(50), absl::Milliseconds(500), 2.0, 0.5};
  o.retry.max_retry_after = absl::Seconds(1);
  return o;
}

namespace {

std::string PodPath(std::string_view ns, std::string_view name) {
  return fmt::format("/api/v1/namespaces/{}/pods/{}", ns, name);
}

}  // namespace

absl::StatusOr<std::string> CreatePod(kube::Transport& t, std::string_view ns,
                                      std::string_view name, const std::string& body) {
  kube::Request r;
  r.method = "POST";
  r.path = fmt::format("/api/v1/namespaces/{}/pods", ns);
  r.body = body;
  r.content_type = "application/json";
  absl::StatusOr<kube::Response> resp = kube::Do(t, r, QuickRetry());
  if (resp.ok()) {
    return std::move(resp->body);
  }
  if (absl::IsAborted(resp.status()) && kube::ReasonOf(resp.status()) == "AlreadyExists") {
    kube::Request get;
    get.path = PodPath(ns, name);
    TESSERA_ASSIGN_OR_RETURN(kube::Response got, kube::Do(t, get, QuickRetry()));
    return std::move(got.body);
  }
  return resp.status();
}

absl::Status DeletePod(kube::Transport& t, std::string_view ns, std::string_view name, int grace) {
  kube::Request r;
  r.method = "DELETE";
  r.path = PodPath(ns, name);
  if (grace >= 0) {
    // DeleteOptions in the body, as client-go sends them.
    r.body =
        json{{"kind", "DeleteOptions"}, {"apiVersion", "v1"}, {"gracePeriodSeconds", grace}}.dump();
    r.content_type = "application/json";
  }
  absl::StatusOr<kube::Response> resp = kube::Do(t, r, QuickRetry());
  if (!resp.ok() && !absl::IsNotFound(resp.status())) {
    return resp.status();
  }
  return absl::OkStatus();
}

absl::Status SetPodPhase(kube::Transport& t, std::string_view ns, std::string_view name,
                         std::string_view phase) {
  kube::Request r;
  r.method = "PATCH";
  r.path = PodPath(ns, name) + "/status";
  r.content_type = "application/merge-patch+json";
  r.body = json{{"status", {{"phase", phase}}}}.dump();
  return kube::Do(t, r, QuickRetry()).status();
}

absl::Status CreateNode(kube::Transport& t, const std::string& body) {
  kube::Request r;
  r.method = "POST";
  r.path = "/api/v1/nodes";
  r.body = body;
  r.content_type = "application/json";
  absl::StatusOr<kube::Response> resp = kube::Do(t, r, QuickRetry());
  if (!resp.ok() &&
      !(absl::IsAborted(resp.status()) && kube::ReasonOf(resp.status()) == "AlreadyExists")) {
    return resp.status();
  }
  return absl::OkStatus();
}

absl::Status DeleteNode(kube::Transport& t, std::string_view name) {
  kube::Request r;
  r.method = "DELETE";
  r.path = fmt::format("/api/v1/nodes/{}", name);
  absl::StatusOr<kube::Response> resp = kube::Do(t, r, QuickRetry());
  if (!resp.ok() && !absl::IsNotFound(resp.status())) {
    return resp.status();
  }
  return absl::OkStatus();
}

absl::Status MakeNodeReady(kube::Transport& t, std::string_view name,
                           const std::string& status_json) {
  kube::Request r;
  r.method = "PATCH";
  r.path = fmt::format("/api/v1/nodes/{}/status", name);
  r.content_type = "application/merge-patch+json";
  r.body = fmt::format("{{\"status\":{}}}", status_json);
  absl::StatusOr<kube::Response> resp = kube::Do(t, r, QuickRetry());
  if (!resp.ok()) {
    return absl::Status(resp.status().code(), fmt::format("PATCH node {} status: {}", name,
                                                          std::string(resp.status().message())));
  }
  kube::Request untaint;
  untaint.method = "PATCH";
  untaint.path = fmt::format("/api/v1/nodes/{}", name);
  untaint.content_type = "application/merge-patch+json";
  untaint.body = R"({"spec":{"taints":null}})";
  resp = kube::Do(t, untaint, QuickRetry());
  if (!resp.ok()) {
    return absl::Status(resp.status().code(), fmt::format("removing node {}'s taints: {}", name,
                                                          std::string(resp.status().message())));
  }
  return absl::OkStatus();
}

namespace {
// POST `body` to `path`; an AlreadyExists is success. `what` names the object in errors.
absl::Status CreateObject(kube::Transport& t, std::string path, std::string body,
                          const std::string& what) {
  kube::Request r;
  r.method = "POST";
  r.path = std::move(path);
  r.content_type = "application/json";
  r.body = std::move(body);
  absl::StatusOr<kube::Response> resp = kube::Do(t, r, QuickRetry());
  if (!resp.ok() &&
      !(absl::IsAborted(resp.status()) && kube::ReasonOf(resp.status()) == "AlreadyExists")) {
    return absl::Status(resp.status().code(),
                        fmt::format("creating {}: {}", what, std::string(resp.status().message())));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status CreateDefaultServiceAccount(kube::Transport& t, std::string_view ns) {
  return CreateObject(t, fmt::format("/api/v1/namespaces/{}/serviceaccounts", ns),
                      json{{"apiVersion", "v1"},
                           {"kind", "ServiceAccount"},
                           {"metadata", {{"name", "default"}, {"namespace", ns}}}}
                          .dump(),
                      fmt::format("ServiceAccount {}/default", ns));
}

absl::Status CreateNamespace(kube::Transport& t, std::string_view ns) {
  return CreateObject(
      t, "/api/v1/namespaces",
      json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}}.dump(),
      fmt::format("Namespace {}", ns));
}

absl::Status CreatePriorityClass(kube::Transport& t, int32_t value) {
  const std::string name = PriorityClassName(value);
  return CreateObject(t, "/apis/scheduling.k8s.io/v1/priorityclasses",
                      json{{"apiVersion", "scheduling.k8s.io/v1"},
                           {"kind", "PriorityClass"},
                           {"metadata", {{"name", name}}},
                           {"value", value}}
                          .dump(),
                      fmt::format("PriorityClass {}", name));
}

absl::Status CreateResourceQuota(kube::Transport& t, std::string_view ns, std::string_view name,
                                 const std::vector<std::pair<std::string, std::string>>& hard) {
  json spec = json::object();
  for (const auto& [key, value] : hard) {
    spec[key] = value;
  }
  return CreateObject(t, fmt::format("/api/v1/namespaces/{}/resourcequotas", ns),
                      json{{"apiVersion", "v1"},
                           {"kind", "ResourceQuota"},
                           {"metadata", {{"name", name}, {"namespace", ns}}},
                           {"spec", {{"hard", spec}}}}
                          .dump(),
                      fmt::format("ResourceQuota {}/{}", ns, name));
}

// ---- workload -------------------------------------------------------------------------------

namespace {
constexpr std::string_view kShapeNames[kShapeCount] = {
    "whole", "memory", "percent", "cores", "multi_gpu", "multi_container", "numa", "typed", "mig"};

json GpuContainer(const std::string& name, int gpus, const json& extra) {
  json limits = {{"nvidia.com/gpu", std::to_string(gpus)}};
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    limits[it.key()] = it.value();
  }
  return {{"name", name}, {"image", "cuda:12"}, {"resources", {{"limits", limits}}}};
}

int Pick(std::mt19937_64& rng, std::initializer_list<int> values) {
  std::uniform_int_distribution<size_t> d(0, values.size() - 1);
  return *(values.begin() + d(rng));
}
}  // namespace

std::string_view ShapeName(Shape s) { return kShapeNames[static_cast<int>(s)]; }

std::optional<Shape> ParseShape(std::string_view name) {
  for (int i = 0; i < kShapeCount; ++i) {
    if (kShapeNames[i] == name) {
      return static_cast<Shape>(i);
    }
  }
  return std::nullopt;
}

std::string PriorityClassName(int32_t priority) { return fmt::format("sim-priority-{}", priority); }

Workload::Workload(std::map<Shape, double> weights, std::string scheduler_name,
                   std::string typed_gpu, const std::map<int32_t, double>& priorities)
    : scheduler_name_(std::move(scheduler_name)), typed_gpu_(std::move(typed_gpu)) {
  double total = 0;
  for (const auto& [value, weight] : priorities) {
    total += std::max(0.0, weight);
    priorities_.emplace_back(value, total);
  }
  double sum = 0;
  for (int i = 0; i < kShapeCount; ++i) {
    auto it = weights.find(static_cast<Shape>(i));
    sum += it == weights.end() ? 0.0 : std::max(0.0, it->second);
    cumulative_.push_back(sum);
  }
  if (sum <= 0) {
    cumulative_.assign(kShapeCount, 1.0);
    std::fill(cumulative_.begin(), cumulative_.begin() + static_cast<int>(Shape::kMemory), 0.0);
  }
}

Shape Workload::Pick(std::mt19937_64& rng) const {
  std::uniform_real_distribution<double> d(0.0, cumulative_.back());
  const double x = d(rng);
  for (int i = 0; i < kShapeCount; ++i) {
    if (x < cumulative_[static_cast<size_t>(i)]) {
      return static_cast<Shape>(i);
    }
  }
  return Shape::kMemory;
}

std::string Workload::PodJson(Shape shape, std::string_view ns, std::string_view name,
                              std::mt19937_64& rng) const {
  json annotations = json::object();
  json containers = json::array();
  const int mem = ::tessera::sim::Pick(rng, {1024, 2048, 4096, 8192});
  switch (shape) {
    case Shape::kWhole:
      containers.push_back(GpuContainer("main", 1, json::object()));
      break;
    case Shape::kMemory:
      containers.push_back(GpuContainer("main", 1, {{"nvidia.com/gpumem", std::to_string(mem)}}));
      break;
    case Shape::kPercent:
      containers.push_back(
          GpuContainer("main", 1,
                       {{"nvidia.com/gpumem-percentage",
                         std::to_string(::tessera::sim::Pick(rng, {10, 25, 50}))}}));
      break;
    case Shape::kCores:
      containers.push_back(GpuContainer(
          "main", 1,
          {{"nvidia.com/gpumem", std::to_string(mem)},
           {"nvidia.com/gpucores", std::to_string(::tessera::sim::Pick(rng, {10, 20, 30, 50}))}}));
      break;
    case Shape::kMultiGpu:
      containers.push_back(GpuContainer("main", ::tessera::sim::Pick(rng, {2, 4}),
                                        {{"nvidia.com/gpumem", std::to_string(mem)}}));
      break;
    case Shape::kMultiContainer:
      containers.push_back({{"name", "sidecar"}, {"image", "busybox"}});
      containers.push_back(GpuContainer("a", 1, {{"nvidia.com/gpumem", std::to_string(mem)}}));
      containers.push_back(GpuContainer("b", 1, {{"nvidia.com/gpumem", "2048"}}));
      break;
    case Shape::kNuma:
      annotations[std::string(device::kNumaBindAnnotation)] = "true";
      containers.push_back(GpuContainer("main", 2, {{"nvidia.com/gpumem", std::to_string(mem)}}));
      break;
    case Shape::kTyped:
      annotations[std::string(device::kUseGpuTypeAnnotation)] = typed_gpu_;
      containers.push_back(GpuContainer("main", 1, {{"nvidia.com/gpumem", std::to_string(mem)}}));
      break;
    case Shape::kMig:
      // Sizes that land on 1g, 2g, 3g and 7g of an A100-40GB (5120, 10240, 20480, 40960 MiB
      // from the geometry tables) and on 1g and 3g of an H100-80GB; a few ask two instances.
      annotations[std::string(device::kVgpuModeAnnotation)] = "mig";
      containers.push_back(GpuContainer(
          "main", ::tessera::sim::Pick(rng, {1, 1, 1, 2}),
          {{"nvidia.com/gpumem",
            std::to_string(::tessera::sim::Pick(rng, {4000, 5000, 9000, 15000, 20000, 35000}))}}));
      break;
  }
  json spec = {{"schedulerName", scheduler_name_},
               {"terminationGracePeriodSeconds", 30},
               {"containers", containers}};
  if (!priorities_.empty()) {  // drawn last: the shapes and sizes stay those of the seed
    const double x = std::uniform_real_distribution<double>(0.0, priorities_.back().second)(rng);
    int32_t priority = priorities_.back().first;
    for (const auto& [value, upto] : priorities_) {
      if (x < upto) {
        priority = value;
        break;
      }
    }
    spec["priority"] = priority;
    spec["priorityClassName"] = PriorityClassName(priority);
  }
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"name", name},
                {"namespace", ns},
                {"labels", {{"app", "sim"}, {"shape", ShapeName(shape)}}},
                {"annotations", annotations}}},
              {"spec", spec},
              {"status", {{"phase", "Pending"}}}};
  return pod.dump();
}

// ---- device plugin --------------------------------------------------------------------------

DevicePlugin::DevicePlugin(std::string node, device::RegisterFormat format,
                           std::vector<device::DeviceInfo> devices)
    : node_(std::move(node)),
      format_(format),
      devices_(std::move(devices)),
      has_mig_(std::any_of(devices_.begin(), devices_.end(),
                           [](const device::DeviceInfo& d) { return d.mode == "mig"; })) {}

std::string DevicePlugin::RegisterValue() const {
  return format_ == device::RegisterFormat::kDelimited
             ? device::EncodeNodeRegisterDelimited(devices_)
             : device::EncodeNodeRegisterJson(devices_);
}

absl::Status DevicePlugin::Register(kube::ApiClient& client, absl::Time now) {
  const std::string value = RegisterValue();
  kube::MetadataPatch patch;
  patch.annotations.emplace_back(std::string(device::kNodeRegisterAnnotation), value);
  if (format_ == device::RegisterFormat::kDelimited) {
    // Go's time.Time.String(): "2006-01-02 15:04:05.999999999 -0700 MST m=+…".
    patch.annotations.emplace_back(
        std::string(device::kNodeHandshakeAnnotation),
        "Reported " + absl::FormatTime("%Y-%m-%d %H:%M:%E*S +0000 UTC", now, absl::UTCTimeZone()) +
            " m=+1.000000001");
  } else {
    MutexLock l(&mu_);
    if (last_written_ == value) {
      return absl::OkStatus();
    }
  }
  TESSERA_RETURN_IF_ERROR(client.PatchNodeMetadata(node_, patch).status());
  MutexLock l(&mu_);
  last_written_ = value;
  return absl::OkStatus();
}

bool AllocationPending(std::string_view to_allocate) {
  absl::StatusOr<device::PodDevices> d = device::DecodePodDevices(to_allocate);
  if (!d.ok()) {
    return false;
  }
  for (const device::ContainerDevices& c : *d) {
    if (!c.empty()) {
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::string> EraseNextEntry(std::string_view value, bool compact, int* devices) {
  TESSERA_ASSIGN_OR_RETURN(device::PodDevices d, device::DecodePodDevices(value));
  if (compact) {
    d.erase(std::remove_if(d.begin(), d.end(),
                           [](const device::ContainerDevices& c) { return c.empty(); }),
            d.end());
  }
  auto it = std::find_if(d.begin(), d.end(),
                         [](const device::ContainerDevices& c) { return !c.empty(); });
  if (it == d.end()) {
    return absl::NotFoundError("no pending device allocation found");
  }
  if (devices != nullptr) {
    *devices = static_cast<int>(it->size());
  }
  it->clear();
  if (!compact) {
    d.emplace_back();  // G3's re-encode keeps the trailing empty entry: one more ';' per call
  }
  return device::EncodePodDevices(d);
}

absl::StatusOr<std::vector<size_t>> ContainerMigReservations(
    const std::vector<device::MigAllocation>& allocations, int container,
    const device::ContainerDevices& devices, const std::vector<device::DeviceInfo>& cards) {
  std::vector<size_t> mine;
  for (size_t i = 0; i < allocations.size(); ++i) {
    if (allocations[i].container_index == container) {
      mine.push_back(i);
    }
  }
  std::sort(mine.begin(), mine.end(), [&](size_t a, size_t b) {
    return allocations[a].device_index < allocations[b].device_index;
  });
  if (mine.size() != devices.size()) {
    return absl::FailedPreconditionError(
        fmt::format("container {} has {} MIG reservations, requested {} devices", container,
                    mine.size(), devices.size()));
  }
  for (size_t k = 0; k < mine.size(); ++k) {
    const device::MigAllocation& a = allocations[mine[k]];
    if (a.gpu_uuid != devices[k].uuid) {
      return absl::FailedPreconditionError(
          fmt::format("container {} device {}: MIG reservation on {} but the device is {}",
                      container, k, a.gpu_uuid, devices[k].uuid));
    }
    auto card = std::find_if(cards.begin(), cards.end(),
                             [&](const device::DeviceInfo& d) { return d.id == a.gpu_uuid; });
    bool valid = false;
    if (card != cards.end() && card->mode == "mig") {
      for (const device::MigProfile& p : card->mig_profiles) {
        if (p.name == a.profile) {
          valid = valid || std::find(p.placements.begin(), p.placements.end(), a.placement) !=
                               p.placements.end();
        }
      }
    }
    if (!valid) {
      return absl::FailedPreconditionError(fmt::format(
          "scheduler selected invalid placement {{start:{}, size:{}}} for profile {} on {}",
          a.placement.start, a.placement.size, a.profile, a.gpu_uuid));
    }
  }
  return mine;
}

absl::Status DevicePlugin::RealiseMig(kube::ApiClient& client, const AllocateResult& result,
                                      kube::Pod& pod,
                                      std::vector<device::MigAllocation>& allocations,
                                      const std::vector<size_t>& indices) {
  for (size_t i : indices) {
    device::MigAllocation& a = allocations[i];
    const uint32_t gi = ++last_gpu_instance_[a.gpu_uuid];
    const size_t h = std::hash<std::string>{}(fmt::format("{}/{}", a.gpu_uuid, gi));
    a.gpu_instance_id = gi;
    a.compute_instance_id = 0;
    a.mig_uuid = fmt::format("MIG-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", h & 0xffffffffu,
                             (h >> 32) & 0xffffu, (h >> 48) & 0xffffu, gi & 0xffffu,
                             static_cast<uint64_t>(h ^ (h >> 17)) & 0xffffffffffffULL);
  }
  kube::MetadataPatch p;
  p.annotations.emplace_back(std::string(device::kMigAllocationsAnnotation),
                             device::EncodeMigAllocations(allocations));
  p.resource_version = pod.meta.resource_version;
  TESSERA_ASSIGN_OR_RETURN(pod, client.PatchPodMetadata(result.ns, result.name, p));
  return absl::OkStatus();
}

absl::Status DevicePlugin::ReleaseLock(kube::ApiClient& client, const AllocateResult& result) {
  // ReleaseNodeLock (HEAD): only a lock this pod owns, with a resourceVersion precondition.
  const std::string owner = "," + result.ns + "," + result.name;
  absl::Status released = absl::OkStatus();
  for (int attempt = 0; attempt < 5; ++attempt) {
    TESSERA_ASSIGN_OR_RETURN(kube::Node node, client.GetNode(node_));
    const std::string current(node.meta.annotations.Get(device::kNodeLockAnnotation));
    if (current.empty() || current.size() < owner.size() ||
        current.compare(current.size() - owner.size(), owner.size(), owner) != 0) {
      released = absl::OkStatus();
      break;
    }
    kube::MetadataPatch unlock;
    unlock.annotations.emplace_back(std::string(device::kNodeLockAnnotation), std::nullopt);
    unlock.resource_version = node.meta.resource_version;
    released = client.PatchNodeMetadata(node_, unlock).status();
    if (released.ok() || !absl::IsAborted(released)) {
      break;
    }
  }
  return released;
}

absl::Status DevicePlugin::Fail(kube::ApiClient& client, const AllocateResult& result) {
  kube::MetadataPatch failed;
  failed.annotations.emplace_back(std::string(device::kBindPhaseAnnotation),
                                  std::string(device::kBindPhaseFailed));
  TESSERA_RETURN_IF_ERROR(client.PatchPodMetadata(result.ns, result.name, failed).status());
  return ReleaseLock(client, result);
}

absl::StatusOr<AllocateResult> DevicePlugin::Allocate(kube::ApiClient& client, std::string_view ns,
                                                      std::string_view name) {
  MutexLock serial(&mu_);
  TESSERA_ASSIGN_OR_RETURN(kube::Node node, client.GetNode(node_));
  AllocateResult result;
  const std::string lock(node.meta.annotations.Get(device::kNodeLockAnnotation));
  std::vector<std::string> parts;
  for (size_t pos = 0; !lock.empty();) {
    const size_t comma = lock.find(',', pos);
    parts.push_back(lock.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) {
      break;
    }
    pos = comma + 1;
  }
  kube::Pod pod;
  if (parts.size() == 3) {
    result.ns = parts[1];
    result.name = parts[2];
    TESSERA_ASSIGN_OR_RETURN(pod, client.GetPod(result.ns, result.name));
  } else {
    // The fallback: the pending pod itself, if it qualifies.
    result.ns = std::string(ns);
    result.name = std::string(name);
    TESSERA_ASSIGN_OR_RETURN(pod, client.GetPod(ns, name));
    const std::string_view phase = pod.meta.annotations.Get(device::kBindPhaseAnnotation);
    if (pod.phase != kube::PodPhase::kPending || pod.node_name != node_ ||
        pod.meta.annotations.Get(device::kVgpuNodeAnnotation) != node_ ||
        !pod.meta.annotations.Contains(device::kBindTimeAnnotation) ||
        (phase != device::kBindPhaseAllocating && phase != device::kBindPhaseSuccess)) {
      return absl::FailedPreconditionError(fmt::format("no binding pod found on node {}", node_));
    }
  }
  const bool compact = format_ == device::RegisterFormat::kDelimited;
  // MIG mode (v2.10's plugin, JSON registration): the pod's reservations, realised per call.
  const bool mig = has_mig_ && !compact;
  std::vector<device::MigAllocation> allocations;
  std::string failure;  // a MIG reservation the plugin cannot realise
  if (mig) {
    absl::StatusOr<std::vector<device::MigAllocation>> decoded =
        device::DecodeMigAllocations(pod.meta.annotations.Get(device::kMigAllocationsAnnotation));
    if (decoded.ok()) {
      allocations = *std::move(decoded);
    } else {
      failure = std::string(decoded.status().message());
    }
  }
  std::string to(pod.meta.annotations.Get(device::kDevicesToAllocateAnnotation));
  while (failure.empty() && AllocationPending(to)) {
    if (mig) {
      // The entry this call consumes: the first non-empty one, its index the container's.
      TESSERA_ASSIGN_OR_RETURN(device::PodDevices entries, device::DecodePodDevices(to));
      size_t c = 0;
      while (c < entries.size() && entries[c].empty()) {
        ++c;
      }
      absl::StatusOr<std::vector<size_t>> mine =
          ContainerMigReservations(allocations, static_cast<int>(c), entries[c], devices_);
      if (!mine.ok()) {
        failure = std::string(mine.status().message());
        break;
      }
      TESSERA_RETURN_IF_ERROR(RealiseMig(client, result, pod, allocations, *mine));
      result.mig_instances += static_cast<int>(mine->size());
    }
    TESSERA_ASSIGN_OR_RETURN(std::string next, EraseNextEntry(to, compact));
    kube::MetadataPatch p;
    p.annotations.emplace_back(std::string(device::kDevicesToAllocateAnnotation), next);
    TESSERA_ASSIGN_OR_RETURN(pod, client.PatchPodMetadata(result.ns, result.name, p));
    ++result.calls;
    to = std::move(next);
  }
  if (!failure.empty()) {
    result.failure = std::move(failure);
    TESSERA_RETURN_IF_ERROR(Fail(client, result));
    return result;
  }
  // podAllocationTrySuccess: re-GET and look for a device left.
  TESSERA_ASSIGN_OR_RETURN(pod, client.GetPod(result.ns, result.name));
  if (AllocationPending(pod.meta.annotations.Get(device::kDevicesToAllocateAnnotation))) {
    return result;
  }
  kube::MetadataPatch success;
  success.annotations.emplace_back(std::string(device::kBindPhaseAnnotation),
                                   std::string(device::kBindPhaseSuccess));
  TESSERA_RETURN_IF_ERROR(client.PatchPodMetadata(result.ns, result.name, success).status());
  TESSERA_RETURN_IF_ERROR(ReleaseLock(client, result));
  result.success = true;
  return result;
}

// ---- kubelet --------------------------------------------------------------------------------

absl::Status Kubelet::Start(kube::Transport& t, std::string_view ns, std::string_view name) {
  return SetPodPhase(t, ns, name, "Running");
}

absl::Status Kubelet::Finish(kube::Transport& t, std::string_view ns, std::string_view name) {
  absl::Status s = SetPodPhase(t, ns, name, "Succeeded");
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

absl::Duration Kubelet::Lifetime(absl::Duration lo, absl::Duration hi, std::mt19937_64& rng) {
  if (hi <= lo) {
    return lo;
  }
  std::uniform_int_distribution<int64_t> d(absl::ToInt64Milliseconds(lo),
                                           absl::ToInt64Milliseconds(hi));
  return absl::Milliseconds(d(rng));
}

// ---- kube-scheduler -------------------------------------------------------------------------

absl::StatusOr<std::string> ExtenderClient::Post(std::string path, std::string body) {
  kube::Request r;
  r.method = "POST";
  r.path = std::move(path);
  r.body = std::move(body);
  r.content_type = "application/json";
  r.timeout = absl::Seconds(30);
  kube::DoOptions o;
  o.retry.max_attempts = 1;
  TESSERA_ASSIGN_OR_RETURN(kube::Response resp, kube::Do(*transport_, r, std::move(o)));
  return std::move(resp.body);
}

namespace {

absl::StatusOr<FilterOutcome> ParseFilterResult(const std::string& body, bool nodes_form) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("filter reply is not a JSON object");
  }
  FilterOutcome out;
  if (j.contains("Error") && j["Error"].is_string() && !j["Error"].get<std::string>().empty()) {
    return absl::AbortedError("filter: " + j["Error"].get<std::string>());
  }
  if (nodes_form) {
    if (j.contains("Nodes") && j["Nodes"].is_object() && j["Nodes"].contains("items") &&
        j["Nodes"]["items"].is_array() && !j["Nodes"]["items"].empty()) {
      out.node = j["Nodes"]["items"][0]["metadata"].value("name", "");
    }
  } else if (j.contains("NodeNames") && j["NodeNames"].is_array() && !j["NodeNames"].empty()) {
    out.node = j["NodeNames"][0].get<std::string>();
  }
  if (out.node.empty() && j.contains("FailedNodes") && j["FailedNodes"].is_object() &&
      !j["FailedNodes"].empty()) {
    out.failed_reason = j["FailedNodes"].begin().value().get<std::string>();
    for (auto it = j["FailedNodes"].begin(); it != j["FailedNodes"].end(); ++it) {
      if (it.value().is_string()) {
        out.failed_reasons.push_back(it.value().get<std::string>());
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<FilterOutcome> ExtenderClient::Filter(const std::string& pod_json,
                                                     const std::vector<std::string>& nodes) {
  std::string body = "{\"Pod\":" + pod_json + ",\"NodeNames\":" + json(nodes).dump() + "}";
  const absl::Time start = clock_->Now();
  TESSERA_ASSIGN_OR_RETURN(std::string reply, Post("/filter", std::move(body)));
  const absl::Duration latency = clock_->Now() - start;
  TESSERA_ASSIGN_OR_RETURN(FilterOutcome out, ParseFilterResult(reply, false));
  out.latency = latency;
  return out;
}

absl::StatusOr<FilterOutcome> ExtenderClient::FilterNodes(
    const std::string& pod_json, const std::vector<std::string>& node_json) {
  std::string body = "{\"Pod\":" + pod_json + ",\"Nodes\":{\"metadata\":{},\"items\":[";
  for (size_t i = 0; i < node_json.size(); ++i) {
    body += (i == 0 ? "" : ",") + node_json[i];
  }
  body += "]}}";
  const absl::Time start = clock_->Now();
  TESSERA_ASSIGN_OR_RETURN(std::string reply, Post("/filter", std::move(body)));
  const absl::Duration latency = clock_->Now() - start;
  TESSERA_ASSIGN_OR_RETURN(FilterOutcome out, ParseFilterResult(reply, true));
  out.latency = latency;
  return out;
}

absl::Status ExtenderClient::Bind(std::string_view ns, std::string_view name, std::string_view uid,
                                  std::string_view node) {
  json args = {{"PodName", name}, {"PodNamespace", ns}, {"PodUID", uid}, {"Node", node}};
  TESSERA_ASSIGN_OR_RETURN(std::string reply, Post("/bind", args.dump()));
  json j = json::parse(reply, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("bind reply is not a JSON object");
  }
  if (j.contains("Error") && j["Error"].is_string() && !j["Error"].get<std::string>().empty()) {
    return absl::AbortedError("bind: " + j["Error"].get<std::string>());
  }
  return absl::OkStatus();
}

void SchedulingQueue::Ready(const std::string& key) {
  pods_[key].state = State::kReady;
  ready_.insert(key);
}

absl::Duration SchedulingQueue::BackoffOf(int attempts) const {
  absl::Duration d = options_.initial;
  for (int i = 1; i < attempts && d < options_.max; ++i) {
    d *= 2;
  }
  return std::min(d, options_.max);
}

uint64_t SchedulingQueue::Attempt(const std::string& key, absl::Time now) {
  ready_.erase(key);
  Pod& pod = pods_[key];
  ++pod.attempts;
  pod.last_attempt = now;
  pod.state = State::kTrying;
  return events_;
}

SchedulingQueue::Now SchedulingQueue::Take(absl::Time now) {
  const bool idle = ready_.empty();
  Now out;
  for (auto& [key, pod] : pods_) {
    if (pod.state == State::kBackoff && (idle || BackoffEnd(pod) <= now)) {
      pod.state = State::kReady;
      ready_.insert(key);
      out.push_back(key);
    }
  }
  return out;
}

SchedulingQueue::Now SchedulingQueue::Refused(const std::string& key, uint64_t token,
                                              absl::Time now) {
  Pod& pod = pods_[key];
  if (events_ != token) {
    pod.state = State::kBackoff;
    return Take(now);
  }
  pod.state = State::kWaiting;
  pod.waiting_since = now;
  return {};
}

absl::Duration SchedulingQueue::Backoff(const std::string& key) const {
  auto it = pods_.find(key);
  return BackoffOf(it == pods_.end() ? 1 : it->second.attempts);
}

SchedulingQueue::Now SchedulingQueue::ClusterEvent(absl::Time now) {
  ++events_;
  for (auto& [key, pod] : pods_) {
    if (pod.state == State::kWaiting) {
      pod.state = State::kBackoff;
    }
  }
  return Take(now);
}

SchedulingQueue::Now SchedulingQueue::PodUpdated(const std::string& key, absl::Time now) {
  auto it = pods_.find(key);
  if (it == pods_.end() || it->second.state != State::kWaiting) {
    return {};
  }
  it->second.state = State::kBackoff;
  return Take(now);
}

SchedulingQueue::Now SchedulingQueue::Flush(absl::Time now) {
  for (auto& [key, pod] : pods_) {
    if (pod.state == State::kWaiting && now - pod.waiting_since >= options_.unschedulable_timeout) {
      pod.state = State::kBackoff;
    }
  }
  return Take(now);
}

int SchedulingQueue::attempts(const std::string& key) const {
  auto it = pods_.find(key);
  return it == pods_.end() ? 0 : it->second.attempts;
}

size_t SchedulingQueue::waiting() const {
  return static_cast<size_t>(std::count_if(
      pods_.begin(), pods_.end(), [](const auto& e) { return e.second.state == State::kWaiting; }));
}

}  // namespace tessera::sim
