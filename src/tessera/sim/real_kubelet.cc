#include "tessera/sim/real_kubelet.h"

#include <cctype>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/base/logging.h"

namespace tessera::sim {

using nlohmann::json;

void RealKubelet::Start() {
  kube::Informer<kube::Pod>::Options io;
  io.name = "sim-kubelet";
  io.reflector.ns = options_.scenario->namespaces.empty() ? kNamespace : "";  // "": every namespace
  kube::EventHandlers<kube::Pod> h;
  h.on_add = [this](const kube::Pod& p, bool) { OnPodSeen(p); };
  h.on_update = [this](const kube::Pod&, const kube::Pod& p) { OnPodSeen(p); };
  informer_ = std::make_unique<kube::Informer<kube::Pod>>(options_.client, io, std::move(h));
  informer_->Start();
  poll_thread_ = std::thread([this] { PollLoop(); });
  supervise_thread_ = std::thread([this] { SuperviseLoop(); });
}

void RealKubelet::Stop() {
  stop_ = true;
  if (poll_thread_.joinable()) {
    poll_thread_.join();
  }
  if (supervise_thread_.joinable()) {
    supervise_thread_.join();
  }
  if (informer_ != nullptr) {
    informer_->Stop();
    informer_.reset();
  }
}

std::string RealKubelet::PodScope() const {
  return options_.scenario->namespaces.empty() ? fmt::format("/api/v1/namespaces/{}", kNamespace)
                                               : "/api/v1";
}

void RealKubelet::OnPodSeen(const kube::Pod& pod) {
  if (pod.node_name.empty()) {
    return;
  }
  const std::string& name = pod.meta.name;
  MutexLock l(&options_.book->mutex);
  auto it = options_.book->pods.find(name);
  if (it == options_.book->pods.end()) {
    return;
  }
  if (it->second.stage == Stage::kPending) {
    it->second.stage = Stage::kBound;
    it->second.node = pod.node_name;
    it->second.bound_at = options_.clock->Now();
    ++options_.book->result.scheduled;
    options_.on_bound(name);
  }
  if (pod.Deleting() && options_.book->terminating.insert(name).second) {
    options_.on_terminating(name);
  }
}

void RealKubelet::Poll() {
  std::vector<std::pair<std::string, std::string>> bound;  // name, node
  std::vector<std::string> unschedulable, terminating;
  std::string cont;
  do {
    kube::Request r;
    std::string escaped;
    for (char c : cont) {
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          c == '~') {
        escaped += c;
      } else {
        escaped += fmt::format("%{:02X}", static_cast<unsigned>(static_cast<unsigned char>(c)));
      }
    }
    r.path =
        fmt::format("{}/pods?limit=500{}", PodScope(), cont.empty() ? "" : "&continue=" + escaped);
    kube::DoOptions once;
    once.retry.max_attempts = 1;
    absl::StatusOr<kube::Response> resp = kube::Do(*options_.poll, r, std::move(once));
    if (!resp.ok()) {
      return;  // the API server restarting: the next poll
    }
    json j = json::parse(resp->body, nullptr, false);
    if (!j.is_object() || !j["items"].is_array()) {
      return;
    }
    for (const json& p : j["items"]) {
      const json& meta = p["metadata"];
      const std::string name = meta.value("name", "");
      const std::string node = p.contains("spec") ? p["spec"].value("nodeName", "") : "";
      if (!node.empty()) {
        bound.emplace_back(name, node);
        if (meta.contains("deletionTimestamp")) {
          terminating.push_back(name);
        }
        continue;
      }
      if (p.contains("status") && p["status"].contains("conditions")) {
        for (const json& c : p["status"]["conditions"]) {
          if (c.value("type", "") == "PodScheduled" && c.value("status", "") == "False" &&
              c.value("reason", "") == "Unschedulable") {
            unschedulable.push_back(name);
          }
        }
      }
    }
    cont = j["metadata"].is_object() ? j["metadata"].value("continue", "") : "";
  } while (!cont.empty());
  MutexLock l(&options_.book->mutex);
  for (const auto& binding : bound) {
    const std::string name = binding.first;
    auto it = options_.book->pods.find(name);
    if (it == options_.book->pods.end() || it->second.stage != Stage::kPending) {
      continue;
    }
    it->second.stage = Stage::kBound;
    it->second.node = binding.second;
    it->second.bound_at = options_.clock->Now();
    ++options_.book->result.scheduled;
    options_.on_bound(name);
  }
  for (const std::string& name : unschedulable) {
    auto it = options_.book->pods.find(name);
    if (it != options_.book->pods.end() && !it->second.ever_unschedulable) {
      it->second.ever_unschedulable = true;
      it->second.refused_at = options_.clock->Now();
      ++options_.book->result.unschedulable;
    }
  }
  // A bound pod being deleted that no kubelet task handles yet (deleted while it looked
  // pending here, then bound): the kubelet finishes it.
  for (const std::string& name : terminating) {
    if (options_.book->terminating.insert(name).second) {
      options_.on_terminating(name);
    }
  }
}

void RealKubelet::SuperviseLoop() {
  while (!stop_.load()) {
    absl::SleepFor(absl::Seconds(1));
    if (stop_.load() || options_.control_plane->Alive("kube-scheduler")) {
      continue;
    }
    options_.book->RecordFault(
        options_.clock->Now(), "scheduler_restart",
        fmt::format("kube-scheduler had exited (see {}/kube-scheduler.log; stock "
                    "kube-scheduler exits when it loses its Lease): started again, as "
                    "its kubelet would",
                    options_.control_plane->env().dir));
    absl::Status s = options_.control_plane->Restart("kube-scheduler", false);
    if (!s.ok()) {
      TESSERA_LOG(kError, "simulate: restarting kube-scheduler: {}", s.ToString());
    }
  }
}

void RealKubelet::PollLoop() {
  while (!stop_.load()) {
    const absl::Time next = options_.clock->Now() + absl::Seconds(2);
    Poll();
    while (!stop_.load() && options_.clock->Now() < next) {
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
}

}  // namespace tessera::sim
