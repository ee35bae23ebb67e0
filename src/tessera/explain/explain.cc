#include "tessera/explain/explain.h"

#include <algorithm>
#include <charconv>
#include <memory>
#include <string_view>
#include <utility>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/accounting/projection.h"
#include "tessera/cycle/cycle.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/ledger/ledger.h"
#include "tessera/schedule/mig_fit.h"
#include "tessera/schedule/score.h"

namespace tessera::explain {
namespace {

// The pod's hami.io/vgpu-time as a time, if it parses.
std::optional<absl::Time> FilterTime(const kube::Pod& pod) {
  std::string_view v = pod.meta.annotations.Get(device::kVgpuTimeAnnotation);
  int64_t seconds = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), seconds);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size()) {
    return std::nullopt;
  }
  return absl::FromUnixSeconds(seconds);
}

// `node`'s devices of `vendor` followed by those of the other kinds: NotFound when no kind
// registers there; another kind's registration that does not decode is a warning.
absl::StatusOr<std::shared_ptr<const device::NodeDevices>> MergedNode(
    const device::Vendor& vendor, const std::vector<const device::Vendor*>& others,
    const kube::Node& node, std::vector<std::string>* warnings) {
  absl::StatusOr<std::shared_ptr<const device::NodeDevices>> own =
      accounting::ProjectNode(vendor, node);
  if (!own.ok() && !absl::IsNotFound(own.status())) {
    return own;
  }
  std::shared_ptr<device::NodeDevices> merged;
  for (const device::Vendor* other : others) {
    absl::StatusOr<std::shared_ptr<const device::NodeDevices>> more =
        accounting::ProjectNode(*other, node);
    if (!more.ok()) {
      if (!absl::IsNotFound(more.status())) {
        warnings->push_back(std::string(more.status().message()));
      }
      continue;
    }
    if (merged == nullptr) {
      merged = own.ok() ? std::make_shared<device::NodeDevices>(**own)
                        : std::make_shared<device::NodeDevices>(**more);
      if (!own.ok()) {
        continue;
      }
    }
    merged->devices.insert(merged->devices.end(), (*more)->devices.begin(), (*more)->devices.end());
    merged->pair_scores.clear();  // pair scores are one kind's, over its own devices
  }
  if (merged == nullptr) {
    return own;
  }
  return std::shared_ptr<const device::NodeDevices>(std::move(merged));
}

}  // namespace

absl::StatusOr<ExplainResult> Explain(const device::Vendor& vendor, const ExplainInput& input) {
  ExplainResult result;
  result.pod = input.pod.Key();

  // Strict: a malformed annotation is reported even for a pod that asks for no device.
  const cycle::Decoded asks = cycle::Decode(vendor, input.pod, cycle::DecodeMode::kStrict);
  if (asks.code == cycle::DecodeCode::kError) {
    return asks.error;
  }
  const device::PodRequest& request = asks.request;
  const device::PodConstraints& constraints = asks.constraints;
  const device::NodePolicy node_policy = constraints.node_policy.value_or(input.node_policy);
  const device::GpuPolicy gpu_policy = constraints.gpu_policy.value_or(input.gpu_policy);
  result.node_policy = device::NodePolicyName(node_policy);
  result.gpu_policy = device::GpuPolicyName(gpu_policy);
  for (const kube::Container& c : input.pod.init_containers) {
    result.container_names.push_back(c.name);
  }
  for (const kube::Container& c : input.pod.containers) {
    result.container_names.push_back(c.name);
  }

  ledger::Ledger ledger;
  std::vector<std::string> unregistered_reason(input.nodes.size());
  for (size_t i = 0; i < input.nodes.size(); ++i) {
    const kube::Node& node = input.nodes[i];
    absl::StatusOr<std::shared_ptr<const device::NodeDevices>> devices =
        MergedNode(vendor, input.node_vendors, node, &result.warnings);
    if (!devices.ok()) {
      if (!absl::IsNotFound(devices.status())) {
        result.warnings.push_back(std::string(devices.status().message()));
      }
      continue;
    }
    absl::Status set = ledger.SetNode(*std::move(devices));
    if (!set.ok()) {
      result.warnings.push_back(
          fmt::format("node {}: {}", node.meta.name, std::string(set.message())));
    }
  }
  for (const kube::Pod& pod : input.pods) {
    if (!input.pod.meta.uid.empty() && pod.meta.uid == input.pod.meta.uid) {
      continue;  // the pod being placed releases whatever it held (a re-filter)
    }
    absl::Status decoded;
    const ledger::PodAllocation alloc = accounting::ProjectPodForLedger(vendor, pod, &decoded);
    if (!decoded.ok()) {
      // Applied all the same: while the pod runs, it blocks its node (holder rule 6).
      result.warnings.push_back(std::string(decoded.message()));
    }
    if (alloc.node.empty()) {
      continue;
    }
    if (absl::Status s = ledger.Apply(alloc); !s.ok()) {
      result.warnings.push_back(fmt::format("pod {}: {}", pod.Key(), std::string(s.message())));
      continue;
    }
    const bool in_flight =
        alloc.bound_node.empty() && !alloc.terminal && !alloc.bind_failed && !alloc.unreadable;
    if (!in_flight) {
      continue;
    }
    std::optional<absl::Time> filtered = FilterTime(pod);
    if (filtered && *filtered + input.reservation_ttl > input.now) {
      absl::Status s = ledger.Reserve(alloc.uid, alloc.ns, alloc.name, alloc.node, alloc.devices,
                                      *filtered + input.reservation_ttl, alloc.init_count);
      if (s.ok()) {
        result.warnings.push_back(
            fmt::format("pod {} is filtered to {} but not bound yet: its devices count as reserved",
                        pod.Key(), alloc.node));
      }
    } else {
      result.warnings.push_back(
          fmt::format("pod {} is annotated for {} but unbound for longer than the reservation "
                      "TTL: it holds nothing",
                      pod.Key(), alloc.node));
    }
  }
  const ledger::Problems problems = ledger.FindProblems();
  for (const ledger::Conflict& c : problems.conflicts) {
    result.warnings.push_back(
        fmt::format("pod {}/{} is annotated for {} but bound to {}: it holds nothing", c.ns, c.name,
                    c.node, c.bound_node));
  }
  for (const ledger::Orphan& o : problems.orphans) {
    result.warnings.push_back(
        fmt::format("pod {}/{} names device {} that node {} does not "
                    "register: that device entry holds nothing",
                    o.ns, o.name, o.uuid, o.node));
  }
  for (const ledger::Unreadable& u : problems.unreadable) {
    result.warnings.push_back(
        fmt::format("pod {}/{} runs on node {} with an allocation Tessera cannot read: it keeps "
                    "node {} unavailable until it is fixed, finishes or is deleted",
                    u.ns, u.name, u.node, u.node));
  }

  std::vector<schedule::Candidate> candidates(input.nodes.size());
  for (size_t i = 0; i < input.nodes.size(); ++i) {
    candidates[i].name = input.nodes[i].meta.name;
  }
  accounting::QuotaBook quotas(input.quota_names);
  quotas.Replace(input.quotas);
  for (const std::string& skipped : quotas.Skipped()) {
    result.warnings.push_back(fmt::format("quota value skipped (not a whole number): {}", skipped));
  }
  const cycle::Result run = cycle::Run(
      {.node_policy = input.node_policy, .gpu_policy = input.gpu_policy, .quotas = &quotas},
      {.pod = &input.pod, .request = &request, .constraints = &constraints, .ledger = &ledger},
      &candidates);
  const schedule::Decision& decision = run.decision;
  result.quota = run.diagnosis.quota;
  result.no_request = decision.no_request;
  for (size_t i = 0; i < decision.nodes.size(); ++i) {
    const schedule::NodeResult& r = decision.nodes[i];
    ExplainNode node;
    node.name = candidates[i].name;
    node.fit = r.fit;
    node.score = r.score;
    if (const std::optional<device::NodeSnapshot>& snap = candidates[i].snapshot;
        snap && snap->devices) {
      const std::vector<device::DeviceInfo>& devs = snap->devices->devices;
      node.gpus = static_cast<int32_t>(devs.size());
      for (size_t d = 0; d < devs.size(); ++d) {
        node.mem_total_mib += devs[d].devmem;
        if (d < snap->usage.size()) {
          node.mem_used_mib += snap->usage[d].usedmem;
          node.slots_used += snap->usage[d].used;
        }
      }
    }
    if (!r.fit) {
      if (!r.reasons.empty()) {
        node.reasons = r.reasons.Strings();
      } else if (!r.reason.empty()) {
        node.reasons.push_back(r.reason);
      }
      const bool mig = std::any_of(r.reasons.begin(), r.reasons.end(), [](const auto& part) {
        return part.reason == schedule::Reason::kCardMigTopologyInfeasible;
      });
      if (mig && r.failed_container >= 0 && candidates[i].snapshot) {
        const auto& container = request.containers[static_cast<size_t>(r.failed_container)];
        if (container.has_value()) {
          node.mig = schedule::ExplainMigNode(*candidates[i].snapshot, *container);
        }
      }
    }
    result.nodes.push_back(std::move(node));
  }
  if (decision.winner) {
    const schedule::Candidate& winner = candidates[*decision.winner];
    result.node = winner.name;
    const device::NodeDevices& devices = *winner.snapshot->devices;
    for (const device::ContainerDevices& container : decision.devices) {
      std::vector<ExplainDevice> out;
      for (const device::ContainerDevice& d : container) {
        ExplainDevice e;
        e.uuid = d.uuid;
        e.mem_mib = d.usedmem;
        e.cores = d.usedcores;
        int pos = devices.Find(d.uuid);
        if (pos >= 0) {
          e.type = devices.devices[pos].type;
          e.index = devices.devices[pos].index;
        } else {
          e.type = d.type;
        }
        out.push_back(std::move(e));
      }
      result.containers.push_back(std::move(out));
    }
    result.annotations = device::FilterAnnotations(vendor, input.pod, winner.name, decision.devices,
                                                   input.now, decision.mig);
    result.labels = device::FilterLabels(winner.name);
  }
  return result;
}

std::string RenderExplainText(const ExplainResult& r, bool wide) {
  std::string out;
  for (const std::string& note : r.webhook) {
    out += fmt::format("admission webhook: {}\n", note);
  }
  if (r.no_request) {
    out +=
        fmt::format("pod {} requests no GPU: Tessera passes every node through unchanged\n", r.pod);
  } else if (r.node) {
    out += fmt::format("pod {} → node {}   (node policy {}, GPU policy {})\n", r.pod, *r.node,
                       r.node_policy, r.gpu_policy);
    for (size_t i = 0; i < r.containers.size(); ++i) {
      std::string name = i < r.container_names.size() ? r.container_names[i] : "?";
      if (r.containers[i].empty()) {
        out += fmt::format("  container {}: no GPU\n", name);
        continue;
      }
      for (const ExplainDevice& d : r.containers[i]) {
        out += fmt::format("  container {}: {} (#{} {}) {} MiB, {}% cores\n", name, d.uuid, d.index,
                           d.type, d.mem_mib, d.cores);
      }
    }
    out += "annotations to write:\n";
    for (const auto& [k, v] : r.annotations) {
      out += fmt::format("  {}: {}\n", k, v);
    }
    for (const auto& [k, v] : r.labels) {
      out += fmt::format("label:\n  {}: {}\n", k, v);
    }
  } else {
    out += fmt::format("pod {} fits no node   (node policy {}, GPU policy {})\n", r.pod,
                       r.node_policy, r.gpu_policy);
  }
  if (!r.quota.empty()) {
    out += fmt::format("quota: {}\n", r.quota);
  }
  size_t width = 4;
  for (const ExplainNode& n : r.nodes) {
    width = std::max(width, n.name.size());
  }
  out += wide ? fmt::format("nodes:\n  {:<{}}  {:<3}  {:>6}  {:>4}  {:>6}  {:>15}  {}\n", "NODE",
                            width, "FIT", "SCORE", "GPUS", "SHARED", "MEMORY MiB", "WHY NOT")
              : fmt::format("nodes:\n  {:<{}}  {:<3}  {:>6}  {}\n", "NODE", width, "FIT", "SCORE",
                            "WHY NOT");
  for (const ExplainNode& n : r.nodes) {
    std::string why;
    for (const std::string& reason : n.reasons) {
      if (!why.empty()) {
        why += ", ";
      }
      why += reason;
    }
    std::string mark = n.fit ? "yes" : "no";
    if (r.node && *r.node == n.name) {
      mark = "yes*";
    }
    std::string line =
        wide ? fmt::format("  {:<{}}  {:<4} {:>6.2f}  {:>4}  {:>6}  {:>15}  {}", n.name, width,
                           mark, n.score, n.gpus, n.slots_used,
                           fmt::format("{}/{}", n.mem_used_mib, n.mem_total_mib), why)
             : fmt::format("  {:<{}}  {:<4} {:>6.2f}  {}", n.name, width, mark, n.score, why);
    while (!line.empty() && line.back() == ' ') {
      line.pop_back();
    }
    out += line + "\n";
  }
  for (const ExplainNode& n : r.nodes) {
    for (const std::string& card : n.mig) {
      out += fmt::format("mig: node {}, card {}\n", n.name, card);
    }
  }
  for (const std::string& w : r.warnings) {
    out += fmt::format("warning: {}\n", w);
  }
  return out;
}

std::string RenderExplainJson(const ExplainResult& r) {
  nlohmann::ordered_json doc;
  doc["pod"] = r.pod;
  doc["node"] = r.node ? nlohmann::ordered_json(*r.node) : nlohmann::ordered_json(nullptr);
  doc["noRequest"] = r.no_request;
  nlohmann::ordered_json containers = nlohmann::ordered_json::array();
  for (const auto& c : r.containers) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const ExplainDevice& d : c) {
      list.push_back(
          {{"uuid", d.uuid}, {"type", d.type}, {"memMiB", d.mem_mib}, {"cores", d.cores}});
    }
    containers.push_back(std::move(list));
  }
  doc["containers"] = std::move(containers);
  nlohmann::ordered_json annotations = nlohmann::ordered_json::object();
  for (const auto& [k, v] : r.annotations) {
    annotations[k] = v;
  }
  doc["annotations"] = std::move(annotations);
  nlohmann::ordered_json labels = nlohmann::ordered_json::object();
  for (const auto& [k, v] : r.labels) {
    labels[k] = v;
  }
  doc["labels"] = std::move(labels);
  nlohmann::ordered_json nodes = nlohmann::ordered_json::object();
  for (const ExplainNode& n : r.nodes) {
    nodes[n.name] = {{"fit", n.fit}, {"score", n.score}, {"reasons", n.reasons}};
    if (!n.mig.empty()) {
      nodes[n.name]["mig"] = n.mig;
    }
  }
  doc["nodes"] = std::move(nodes);
  doc["policies"] = {{"node", r.node_policy}, {"gpu", r.gpu_policy}};
  doc["warnings"] = r.warnings;
  doc["webhook"] = r.webhook;
  doc["quota"] =
      r.quota.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.quota);
  return doc.dump(2) + "\n";
}

}  // namespace tessera::explain
