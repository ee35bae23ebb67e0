#include "tessera/sim/cluster_emulation.h"

#include <algorithm>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/device/mig.h"
#include "tessera/kube/informer.h"

namespace tessera::sim {
namespace {

using json = nlohmann::json;

constexpr std::string_view kGpuResource = "nvidia.com/gpu";
constexpr std::string_view kPauseImage = "registry.k8s.io/pause:3.10";
// The label of the webhook's objectSelector that opts a pod out (deploy/base/webhook.yaml).
constexpr std::string_view kWebhookLabel = "hami.io/webhook";
// What the scheduler writes (Tessera's webhook refuses them on a CREATE, extender/webhook.h
// SchedulerOwnedAnnotations): patched on afterwards.
constexpr std::string_view kSchedulerAnnotations[] = {
    device::kVgpuNodeAnnotation,         device::kBindTimeAnnotation,
    device::kBindPhaseAnnotation,        device::kDevicesToAllocateAnnotation,
    device::kDevicesAllocatedAnnotation, device::kMigAllocationsAnnotation,
    device::kVgpuTimeAnnotation,         device::kVerdictAnnotation,
};

bool SchedulerWritten(std::string_view key) {
  return std::find(std::begin(kSchedulerAnnotations), std::end(kSchedulerAnnotations), key) !=
         std::end(kSchedulerAnnotations);
}

json MapJson(const kube::StringMap& m) {
  json j = json::object();
  for (const auto& [k, v] : m) {
    j[std::string(k)] = v;
  }
  return j;
}

json ResourcesJson(const kube::ResourceList& m) {
  json j = json::object();
  for (const auto& [k, v] : m) {
    j[std::string(k)] = std::string(std::string_view(v));
  }
  return j;
}

// A 409 AlreadyExists (a retried create that had succeeded, or a restarted emulator).
bool AlreadyExists(const absl::Status& s) {
  return absl::IsAborted(s) && kube::ReasonOf(s) == "AlreadyExists";
}

absl::Status Invalid(std::string_view source, std::string_view what, std::string_view msg) {
  return absl::InvalidArgumentError(fmt::format("{}: {}: {}", source, what, msg));
}

absl::StatusOr<PlannedNode> PlanNode(const kube::Node& n, std::string_view source,
                                     std::vector<std::string>* warnings) {
  const std::string what = fmt::format("Node {}", n.meta.name);
  if (!kube::IsDnsSubdomain(n.meta.name)) {
    return Invalid(source, what, "metadata.name is not a valid node name");
  }
  const kube::StringMap& ann = n.meta.annotations;
  const std::string* reg = ann.Find(device::kNodeRegisterAnnotation);
  if (reg == nullptr) {
    return Invalid(source, what,
                   fmt::format("no {} annotation: the emulated device plugin registers the "
                               "devices the file names, and this node names none",
                               device::kNodeRegisterAnnotation));
  }
  absl::StatusOr<device::DecodedRegister> decoded = device::DecodeNodeRegister(*reg);
  if (!decoded.ok()) {
    return Invalid(source, what,
                   fmt::format("annotation {} does not decode: {}", device::kNodeRegisterAnnotation,
                               std::string(decoded.status().message())));
  }
  if (decoded->devices.empty()) {
    return Invalid(source, what,
                   fmt::format("annotation {} lists no device", device::kNodeRegisterAnnotation));
  }
  PlannedNode p;
  p.name = n.meta.name;
  p.format = decoded->format;
  p.devices = decoded->devices;
  if (const std::string* gpus = n.allocatable.Find(kGpuResource); gpus != nullptr) {
    if (!absl::SimpleAtoi(*gpus, &p.gpus) || p.gpus < 0) {
      return Invalid(source, what,
                     fmt::format("status.allocatable[{}] = \"{}\" is not a whole number",
                                 kGpuResource, *gpus));
    }
  } else {
    for (const device::DeviceInfo& d : p.devices) {
      p.gpus += d.count;
    }
  }

  json labels = MapJson(n.meta.labels);
  if (!labels.contains("kubernetes.io/hostname")) {
    labels["kubernetes.io/hostname"] = p.name;  // the kubelet's own label
  }
  json annotations = json::object();
  for (const auto& [k, v] : ann) {
    // The plugin writes its registration (and handshake) itself; a node lock recorded in the
    // file would be a lock of a run that is over, and would hold binds off for its lifetime.
    if (k == device::kNodeRegisterAnnotation || k == device::kNodeHandshakeAnnotation) {
      continue;
    }
    if (k == device::kNodeLockAnnotation) {
      warnings->push_back(
          fmt::format("{}: {}: annotation {} dropped (a lock of another run)", source, what, k));
      continue;
    }
    annotations[std::string(k)] = v;
  }
  json spec = json::object();
  if (n.unschedulable) {
    spec["unschedulable"] = true;
  }
  json node = {{"apiVersion", "v1"},
               {"kind", "Node"},
               {"metadata", {{"name", p.name}, {"labels", labels}}},
               {"spec", spec}};
  if (!annotations.empty()) {
    node["metadata"]["annotations"] = annotations;
  }
  p.node_json = node.dump();

  json alloc = ResourcesJson(kube::ResourceList());
  for (const auto& [k, v] : n.allocatable) {
    alloc[std::string(k)] = v;
  }
  alloc[std::string(kGpuResource)] = std::to_string(p.gpus);
  // What any kubelet reports; kube-scheduler needs `pods` to place anything.
  for (const auto& [k, v] :
       {std::pair<const char*, const char*>{"cpu", "32"}, {"memory", "128Gi"}, {"pods", "110"}}) {
    if (!alloc.contains(k)) {
      alloc[k] = v;
    }
  }
  p.status_json = json{{"capacity", alloc}, {"allocatable", alloc}}.dump();
  return p;
}

json ContainersJson(const std::vector<kube::Container>& cs) {
  json out = json::array();
  for (const kube::Container& c : cs) {
    json resources = json::object();
    if (!c.limits.empty()) {
      resources["limits"] = ResourcesJson(c.limits);
    }
    if (!c.requests.empty()) {
      resources["requests"] = ResourcesJson(c.requests);
    }
    json cj = {{"name", c.name}, {"image", kPauseImage}, {"resources", resources}};
    if (c.privileged) {
      cj["securityContext"] = {{"privileged", true}};
    }
    out.push_back(std::move(cj));
  }
  return out;
}

absl::Status CheckContainers(const std::vector<kube::Container>& cs, std::string_view source,
                             std::string_view what) {
  for (const kube::Container& c : cs) {
    if (!kube::IsDnsLabel(c.name)) {
      return Invalid(source, what, fmt::format("container name \"{}\" is not valid", c.name));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PlannedPod> PlanPod(const kube::Pod& pod, const std::set<std::string>& nodes,
                                   std::string_view source) {
  PlannedPod p;
  p.ns = pod.meta.ns.empty() ? "default" : pod.meta.ns;
  p.name = pod.meta.name;
  const std::string what = fmt::format("Pod {}/{}", p.ns, p.name);
  if (!kube::IsDnsLabel(p.ns)) {
    return Invalid(source, what, "metadata.namespace is not a valid namespace name");
  }
  if (!kube::IsDnsSubdomain(p.name)) {
    return Invalid(source, what, "metadata.name is not a valid pod name");
  }
  if (pod.containers.empty()) {
    return Invalid(source, what, "spec.containers is empty");
  }
  TESSERA_RETURN_IF_ERROR(CheckContainers(pod.containers, source, what));
  TESSERA_RETURN_IF_ERROR(CheckContainers(pod.init_containers, source, what));
  if (!pod.node_name.empty() && nodes.count(pod.node_name) == 0) {
    return Invalid(source, what,
                   fmt::format("spec.nodeName {} is not a node of the file (no kubelet would run "
                               "the pod)",
                               pod.node_name));
  }
  p.node = pod.node_name;
  p.phase = pod.phase;
  json meta = {{"name", p.name}, {"namespace", p.ns}};
  json labels = MapJson(pod.meta.labels);
  if (!p.node.empty()) {
    labels[std::string(kWebhookLabel)] = "ignore";  // see ClusterPlan
  }
  if (!labels.empty()) {
    meta["labels"] = labels;
  }
  json created = json::object(), scheduled = json::object();
  for (const auto& [k, v] : pod.meta.annotations) {
    (p.node.empty() && SchedulerWritten(k) ? scheduled : created)[std::string(k)] = v;
  }
  if (!created.empty()) {
    meta["annotations"] = created;
  }
  if (!scheduled.empty()) {
    p.scheduler_patch = json{{"metadata", {{"annotations", scheduled}}}}.dump();
  }
  json spec = {{"containers", ContainersJson(pod.containers)}};
  if (!pod.init_containers.empty()) {
    spec["initContainers"] = ContainersJson(pod.init_containers);
  }
  if (!pod.scheduler_name.empty()) {
    spec["schedulerName"] = pod.scheduler_name;
  }
  if (!pod.node_name.empty()) {
    spec["nodeName"] = pod.node_name;
  }
  p.json = json{{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", meta}, {"spec", spec}}.dump();
  return p;
}

std::string_view FormatName(device::RegisterFormat f) {
  return f == device::RegisterFormat::kDelimited ? "v2.5 delimited" : "v2.8 JSON";
}

}  // namespace

absl::StatusOr<ClusterPlan> PlanCluster(const kube::Manifests& manifests, std::string_view source) {
  ClusterPlan plan;
  plan.warnings = manifests.warnings;
  if (manifests.nodes.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: no Node: a cluster file holds the nodes to emulate (kubectl get "
                    "nodes,pods -A -o yaml)",
                    source));
  }
  std::set<std::string> node_names;
  for (const kube::Node& n : manifests.nodes) {
    TESSERA_ASSIGN_OR_RETURN(PlannedNode p, PlanNode(n, source, &plan.warnings));
    if (!node_names.insert(p.name).second) {
      return Invalid(source, "Node " + p.name, "a second node of this name");
    }
    plan.nodes.push_back(std::move(p));
  }
  std::set<std::string> pod_keys, namespaces;
  for (const kube::Pod& pod : manifests.pods) {
    TESSERA_ASSIGN_OR_RETURN(PlannedPod p, PlanPod(pod, node_names, source));
    if (!pod_keys.insert(p.ns + "/" + p.name).second) {
      return Invalid(source, fmt::format("Pod {}/{}", p.ns, p.name), "a second pod of this name");
    }
    namespaces.insert(p.ns);
    plan.pods.push_back(std::move(p));
  }
  plan.namespaces.assign(namespaces.begin(), namespaces.end());
  return plan;
}

absl::StatusOr<ClusterPlan> LoadClusterPlan(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(kube::Manifests m, kube::LoadManifestFile(path));
  return PlanCluster(m, path);
}

std::string NodeStatusJson(const PlannedNode& node, absl::Time now) {
  json status = json::parse(node.status_json);
  const std::string t = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", now, absl::UTCTimeZone());
  status["conditions"] = {{{"type", "Ready"},
                           {"status", "True"},
                           {"reason", "KubeletReady"},
                           {"message", "kubelet of tessera emulate"},
                           {"lastHeartbeatTime", t},
                           {"lastTransitionTime", t}}};
  return status.dump();
}

ClusterEmulation::ClusterEmulation(ClusterPlan plan, kube::Transport* transport,
                                   kube::ApiClient* client, Options options)
    : plan_(std::move(plan)), transport_(transport), client_(client), options_(options) {
  for (const PlannedNode& n : plan_.nodes) {
    plugins_[n.name] = std::make_unique<DevicePlugin>(n.name, n.format, n.devices);
  }
  for (const PlannedPod& p : plan_.pods) {
    file_phase_[p.ns + "/" + p.name] = p.phase;
  }
}

absl::Status ClusterEmulation::Setup() {
  for (const std::string& ns : plan_.namespaces) {
    kube::Request r;
    r.method = "POST";
    r.path = "/api/v1/namespaces";
    r.content_type = "application/json";
    r.body = json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}}.dump();
    absl::StatusOr<kube::Response> resp = kube::Do(*transport_, r, QuickRetry());
    if (!resp.ok() && !AlreadyExists(resp.status())) {
      return absl::Status(resp.status().code(), fmt::format("creating namespace {}: {}", ns,
                                                            std::string(resp.status().message())));
    }
    if (absl::Status s = CreateDefaultServiceAccount(*transport_, ns);
        !s.ok() && !AlreadyExists(s)) {
      return s;
    }
    TESSERA_LOG(kInfo, "namespace {} ready (with ServiceAccount default)", ns);
  }
  for (const PlannedNode& n : plan_.nodes) {
    absl::Status s = CreateNode(*transport_, n.node_json);
    if (!s.ok() && !AlreadyExists(s)) {
      return absl::Status(s.code(),
                          fmt::format("creating node {}: {}", n.name, std::string(s.message())));
    }
    s = MakeNodeReady(*transport_, n.name, NodeStatusJson(n, options_.clock->Now()));
    if (!s.ok()) {
      return absl::Status(s.code(),
                          fmt::format("node {} status: {}", n.name, std::string(s.message())));
    }
    DevicePlugin& plugin = *plugins_.at(n.name);
    s = plugin.Register(*client_, options_.clock->Now());
    if (!s.ok()) {
      return absl::Status(s.code(),
                          fmt::format("registering node {}: {}", n.name, std::string(s.message())));
    }
    ++counters_.registered;
    if (n.format == device::RegisterFormat::kDelimited) {
      next_report_[n.name] = options_.clock->Now() + options_.report_every;
    }
    std::vector<std::string> ids;
    for (const device::DeviceInfo& d : n.devices) {
      ids.push_back(d.id);
    }
    TESSERA_LOG(kInfo,
                "node {} registered ({}{}): {} GPUs [{}], allocatable nvidia.com/gpu {}, Ready, "
                "not-ready taint removed",
                n.name, FormatName(n.format),
                n.format == device::RegisterFormat::kDelimited ? ", handshake Reported" : "",
                n.devices.size(), absl::StrJoin(ids, " "), n.gpus);
  }
  for (const PlannedPod& p : plan_.pods) {
    absl::StatusOr<std::string> created = CreatePod(*transport_, p.ns, p.name, p.json);
    if (!created.ok() && AlreadyExists(created.status())) {
      TESSERA_LOG(kInfo, "pod {}/{} exists already (left as it is)", p.ns, p.name);
      continue;
    }
    if (!created.ok()) {
      return absl::Status(created.status().code(),
                          fmt::format("creating pod {}/{}: {}", p.ns, p.name,
                                      std::string(created.status().message())));
    }
    if (!p.scheduler_patch.empty()) {
      kube::Request r;
      r.method = "PATCH";
      r.path = fmt::format("/api/v1/namespaces/{}/pods/{}", p.ns, p.name);
      r.content_type = "application/merge-patch+json";
      r.body = p.scheduler_patch;
      absl::StatusOr<kube::Response> resp = kube::Do(*transport_, r, QuickRetry());
      if (!resp.ok()) {
        return absl::Status(resp.status().code(),
                            fmt::format("annotating pod {}/{}: {}", p.ns, p.name,
                                        std::string(resp.status().message())));
      }
    }
    TESSERA_LOG(kInfo, "pod {}/{} created{}{}", p.ns, p.name,
                p.node.empty() ? " (unbound: kube-scheduler places it)"
                               : fmt::format(" bound to node {}", p.node),
                p.scheduler_patch.empty() ? "" : ", then given the scheduler's annotations");
  }
  return absl::OkStatus();
}

void ClusterEmulation::HandlePod(const kube::Pod& pod, DevicePlugin& plugin, absl::Time now) {
  const std::string& ns = pod.meta.ns;
  const std::string& name = pod.meta.name;
  const std::string id = pod.meta.uid.empty() ? pod.Key() : pod.meta.uid;
  if (pod.Deleting()) {
    // The kubelet stops the containers, reports the pod terminal, then deletes it with grace 0:
    // a real API server keeps a gracefully deleted pod until then.
    absl::Status s = pod.Terminal() ? absl::OkStatus() : Kubelet::Finish(*transport_, ns, name);
    if (s.ok() || absl::IsNotFound(s)) {
      s = DeletePod(*transport_, ns, name, 0);
    }
    if (!s.ok()) {
      ++counters_.errors;
      TESSERA_LOG(kWarning, "pod {}/{} on node {}: finishing the deletion: {} (retrying)", ns, name,
                  plugin.node(), std::string(s.message()));
      return;
    }
    ++counters_.deleted;
    TESSERA_LOG(kInfo, "pod {}/{} deleted: containers stopped on node {}, deletion finished", ns,
                name, plugin.node());
    started_.erase(id);
    ended_.erase(id);
    waiting_.erase(id);
    return;
  }
  if (pod.Terminal()) {
    return;
  }
  if (pod.phase == kube::PodPhase::kPending && started_.count(id) == 0) {
    const kube::StringMap& ann = pod.meta.annotations;
    const bool allocating = ann.Get(device::kBindPhaseAnnotation) == device::kBindPhaseAllocating &&
                            AllocationPending(ann.Get(device::kDevicesToAllocateAnnotation));
    if (allocating) {
      absl::StatusOr<AllocateResult> a = plugin.Allocate(*client_, ns, name);
      if (!a.ok()) {
        if (!absl::IsFailedPrecondition(a.status())) {
          ++counters_.errors;
        }
        auto [it, first] = waiting_.emplace(id, now);
        if (first || now - it->second > options_.allocate_patience) {
          it->second = now;
          TESSERA_LOG(kWarning, "pod {}/{} on node {}: Allocate: {} (retrying)", ns, name,
                      plugin.node(), std::string(a.status().message()));
        }
        return;
      }
      if (a->ns != ns || a->name != name) {
        // The node lock named another pod: the plugin served that one (as HAMi's does).
        if (a->success) {
          ++counters_.allocated;
          TESSERA_LOG(kInfo,
                      "pod {}/{} allocated on node {} ({} Allocate calls, bind-phase=success)",
                      a->ns, a->name, plugin.node(), a->calls);
        }
        return;
      }
      if (!a->success) {
        return;  // entries left: the next pass goes on
      }
      ++counters_.allocated;
      waiting_.erase(id);
      TESSERA_LOG(kInfo, "pod {}/{} allocated on node {} ({} Allocate calls, bind-phase=success)",
                  ns, name, plugin.node(), a->calls);
    }
    absl::Status s = Kubelet::Start(*transport_, ns, name);
    if (!s.ok()) {
      if (!absl::IsNotFound(s)) {
        ++counters_.errors;
        TESSERA_LOG(kWarning, "pod {}/{} on node {}: setting Running: {} (retrying)", ns, name,
                    plugin.node(), std::string(s.message()));
      }
      return;
    }
    started_.insert(id);
    ++counters_.started;
    TESSERA_LOG(kInfo, "pod {}/{} running on node {}", ns, name, plugin.node());
  }
  // A pod the file records as ended runs, then ends as the file says.
  auto want = file_phase_.find(pod.Key());
  if (want != file_phase_.end() &&
      (want->second == kube::PodPhase::kSucceeded || want->second == kube::PodPhase::kFailed) &&
      ended_.count(id) == 0) {
    const std::string_view phase = kube::PodPhaseName(want->second);
    absl::Status s = SetPodPhase(*transport_, ns, name, phase);
    if (!s.ok()) {
      ++counters_.errors;
      return;
    }
    ended_.insert(id);
    ++counters_.ended;
    TESSERA_LOG(kInfo, "pod {}/{} on node {} ended: {} (as the cluster file records)", ns, name,
                plugin.node(), phase);
  }
}

void ClusterEmulation::Step(const std::vector<kube::Pod>& pods, absl::Time now) {
  for (const kube::Pod& pod : pods) {
    auto it = plugins_.find(pod.node_name);
    if (it == plugins_.end()) {
      continue;
    }
    HandlePod(pod, *it->second, now);
  }
  for (auto& [node, due] : next_report_) {
    if (now < due) {
      continue;
    }
    absl::Status s = plugins_.at(node)->Register(*client_, now);
    if (s.ok()) {
      ++counters_.registered;
      due = now + options_.report_every;
      TESSERA_VLOG(1, "node {}: handshake Reported", node);
    } else {
      ++counters_.errors;
      TESSERA_LOG(kWarning, "node {}: handshake report: {} (retrying)", node,
                  std::string(s.message()));
    }
  }
}

absl::Status ClusterEmulation::Run() {
  kube::Informer<kube::Pod>::Options io;
  io.name = "emulate-kubelet";
  // Every namespace: kube-scheduler may bind any pod to an emulated node.
  kube::Informer<kube::Pod> informer(client_, io, kube::EventHandlers<kube::Pod>{});
  informer.Start();
  while (!stop_.load() && !informer.WaitForSync(absl::Milliseconds(200))) {
  }
  if (!stop_.load()) {
    TESSERA_LOG(kInfo, "watching pods: running the device plugins and kubelets of {} nodes",
                plan_.nodes.size());
  }
  while (!stop_.load()) {
    std::vector<kube::Pod> pods;
    for (const PlannedNode& n : plan_.nodes) {
      for (const auto& p : informer.store().ListByNode(n.name)) {
        pods.push_back(*p);
      }
    }
    Step(pods, options_.clock->Now());
    absl::SleepFor(options_.tick);
  }
  informer.Stop();
  TESSERA_LOG(kInfo,
              "stopped: {} registrations, {} pods allocated, {} started, {} ended, {} deletions "
              "finished, {} API errors",
              counters_.registered, counters_.allocated, counters_.started, counters_.ended,
              counters_.deleted, counters_.errors);
  return absl::OkStatus();
}

}  // namespace tessera::sim
