#include "tessera/sim/pod_pipeline.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace tessera::sim {

using nlohmann::json;

PodPipeline::PodPipeline(Options options)
    : options_(std::move(options)),
      workload_(options_.scenario->shapes, "hami-scheduler", options_.scenario->gpu_types.front(),
                options_.scenario->priorities),
      rng_(options_.scenario->seed) {}

uint64_t PodPipeline::Rand() {
  MutexLock l(&rng_mutex_);
  return rng_();
}

void PodPipeline::OnBound(const std::string& name) {
  options_.node_tasks->Post(Now(), [this, name] { AllocateTask(name, 0); });
}

void PodPipeline::OnTerminating(const std::string& name) {
  options_.node_tasks->Post(Now() + absl::Milliseconds(300), [this, name] { TerminateTask(name); });
}

void PodPipeline::CreateTask(const std::string& name) {
  std::string body;
  bool full_nodes;
  {
    MutexLock l(&rng_mutex_);
    const Shape shape = workload_.Pick(rng_);
    body = workload_.PodJson(shape, options_.scenario->NamespaceOf(name), name, rng_);
    full_nodes =
        std::uniform_real_distribution<double>(0, 1)(rng_) < options_.scenario->full_nodes_share;
  }
  absl::StatusOr<std::string> created =
      CreatePod(*options_.api, options_.scenario->NamespaceOf(name), name, body);
  MutexLock l(&options_.book->mutex);
  SimPod& p = options_.book->pods[name];
  if (!created.ok()) {
    if (++p.tries < 30 && options_.book->workload_on) {
      options_.tasks->Post(Now() + absl::Milliseconds(300), [this, name] { CreateTask(name); });
    } else {
      p.stage = Stage::kGone;
    }
    return;
  }
  json j = json::parse(*created, nullptr, false);
  p.uid = j.is_object() ? j["metadata"].value("uid", "") : "";
  p.json = std::move(*created);
  p.full_nodes = full_nodes;
  p.tries = 0;
  if (p.stage == Stage::kCreating) {
    p.stage = Stage::kPending;
    p.created_at = Now();
    ++options_.book->result.created;
    if (!options_.real) {  // else the real kube-scheduler's
      options_.book->queue.Ready(name);
      options_.tasks->Post(Now(), [this, name] { ScheduleTask(name); });
    }
  }
}

void PodPipeline::Retry(const SchedulingQueue::Now& names) {
  for (const std::string& name : names) {
    options_.tasks->Post(Now(), [this, name] { ScheduleTask(name); });
  }
}

void PodPipeline::ScheduleTask(const std::string& name) {
  std::string pod_json, uid;
  bool full_nodes;
  uint64_t token = 0;
  std::vector<std::string> node_json;
  {
    MutexLock l(&options_.book->mutex);
    auto it = options_.book->pods.find(name);
    if (it == options_.book->pods.end() || it->second.stage != Stage::kPending) {
      options_.book->queue.Forget(name);
      return;
    }
    pod_json = it->second.json;
    uid = it->second.uid;
    full_nodes = it->second.full_nodes;
    if (full_nodes) {
      for (const SimNode& n : options_.book->nodes) {
        if (n.alive) {
          node_json.push_back(n.json);
        }
      }
    }
    token = options_.book->queue.Attempt(name, Now());
  }
  const std::vector<std::string> names = options_.book->AliveNodes();
  if (full_nodes) {
    absl::StatusOr<FilterOutcome> preview = options_.extender->FilterNodes(pod_json, node_json);
    MutexLock l(&options_.book->mutex);
    if (preview.ok()) {
      ++options_.book->result.full_nodes_filters;
      options_.book->filter_ms.push_back(absl::ToDoubleMilliseconds(preview->latency));
    }
  }
  absl::StatusOr<FilterOutcome> f = options_.extender->Filter(pod_json, names);
  absl::Duration retry;
  {
    MutexLock l(&options_.book->mutex);
    SimPod& p = options_.book->pods[name];
    if (!f.ok()) {
      ++options_.book->result.filter_errors;
      retry = absl::Milliseconds(500);
    } else {
      options_.book->filter_ms.push_back(absl::ToDoubleMilliseconds(f->latency));
      if (f->node.empty()) {
        ++options_.book->result.unschedulable_attempts;
        if (absl::StrContains(f->failed_reason, "ResourceQuotaNotFit")) {
          ++options_.book->result.quota_refusals;
        }
        if (std::any_of(f->failed_reasons.begin(), f->failed_reasons.end(),
                        [](const std::string& why) {
                          return absl::StrContains(why, "CardMigTopologyInfeasible");
                        })) {
          ++options_.book->result.mig_refusals;
        }
        if (!p.ever_unschedulable) {
          p.ever_unschedulable = true;
          p.refused_at = Now();
          ++options_.book->result.unschedulable;
        }
        // kube-scheduler keeps it among the unschedulable pods until an event moves it
        // (SchedulerEvents), unless one came during this attempt.
        Retry(options_.book->queue.Refused(name, token, Now()));
        return;
      }
    }
    if (retry > absl::ZeroDuration()) {
      if (p.stage == Stage::kPending) {
        options_.tasks->Post(Now() + retry, [this, name] { ScheduleTask(name); });
      }
      return;
    }
  }
  absl::Status bound =
      options_.extender->Bind(options_.scenario->NamespaceOf(name), name, uid, f->node);
  MutexLock l(&options_.book->mutex);
  SimPod& p = options_.book->pods[name];
  if (!bound.ok()) {
    ++options_.book->result.bind_errors;
    if (p.stage == Stage::kPending) {
      const absl::Duration d =
          options_.book->queue.Backoff(name) / 4;  // lock contention clears fast
      options_.tasks->Post(Now() + d, [this, name] { ScheduleTask(name); });
    }
    return;
  }
  options_.book->queue.Forget(name);
  ++options_.book->result.scheduled;
  options_.book->pods[name].bound_at = Now();
  if (const SimNode* n = options_.book->NodeByName(f->node); n != nullptr && n->mig) {
    ++options_.book->result.mig_pods;
  }
  if (p.stage == Stage::kPending) {
    p.stage = Stage::kBound;
    p.node = f->node;
    options_.node_tasks->Post(Now(), [this, name] { AllocateTask(name, 0); });
  }
}

void PodPipeline::AllocateTask(const std::string& name, int tries) {
  DevicePlugin* plugin = nullptr;
  {
    MutexLock l(&options_.book->mutex);
    auto it = options_.book->pods.find(name);
    if (it == options_.book->pods.end() || it->second.stage != Stage::kBound) {
      return;
    }
    SimNode* n = options_.book->NodeByName(it->second.node);
    if (n == nullptr || !n->alive) {
      return;
    }
    if (n->stopped) {  // the kubelet waits for the plugin
      options_.node_tasks->Post(Now() + absl::Seconds(1),
                                [this, name, tries] { AllocateTask(name, tries); });
      return;
    }
    plugin = n->plugin.get();
  }
  absl::StatusOr<AllocateResult> a =
      plugin->Allocate(*options_.node_client, options_.scenario->NamespaceOf(name), name);
  if (a.ok() && !a->failure.empty()) {
    // The plugin could not realise a MIG reservation the scheduler wrote: a wrong placement.
    options_.observer->AddViolation(Now(), fmt::format("the device plugin of {} failed pod {}: {}",
                                                       plugin->node(), a->name, a->failure));
  }
  MutexLock l(&options_.book->mutex);
  if (a.ok()) {
    options_.book->result.mig_instances += a->mig_instances;
  }
  if (a.ok() && a->success && a->name == name) {
    ++options_.book->result.allocations;
    options_.node_tasks->Post(Now(), [this, name] { StartTask(name); });
    return;
  }
  // On the real control plane kube-apiserver restarts (several seconds each, back to back under
  // chaos) can outlast 60 tries; a kubelet keeps retrying, and giving up would leave the node
  // lock held by a bound pod that is never allocated.
  if (tries < (options_.real ? 600 : 60)) {
    options_.node_tasks->Post(Now() + absl::Milliseconds(250),
                              [this, name, tries] { AllocateTask(name, tries + 1); });
  }
}

void PodPipeline::StartTask(const std::string& name) {
  {
    MutexLock l(&options_.book->mutex);
    auto it = options_.book->pods.find(name);
    if (it == options_.book->pods.end() || it->second.stage != Stage::kBound) {
      return;
    }
  }
  absl::Status s = Kubelet::Start(*options_.node, options_.scenario->NamespaceOf(name), name);
  absl::Duration life;
  {
    MutexLock l(&rng_mutex_);
    life =
        Kubelet::Lifetime(options_.scenario->lifetime_min, options_.scenario->lifetime_max, rng_);
  }
  MutexLock l(&options_.book->mutex);
  SimPod& p = options_.book->pods[name];
  if (!s.ok()) {
    if (p.stage == Stage::kBound && !absl::IsNotFound(s)) {
      options_.node_tasks->Post(Now() + absl::Milliseconds(300), [this, name] { StartTask(name); });
    }
    return;
  }
  if (p.stage == Stage::kBound) {
    p.stage = Stage::kRunning;
    options_.tasks->Post(Now() + life, [this, name] { FinishTask(name); });
  }
}

void PodPipeline::FinishTask(const std::string& name) {
  {
    MutexLock l(&options_.book->mutex);
    auto it = options_.book->pods.find(name);
    if (it == options_.book->pods.end() || it->second.stage != Stage::kRunning) {
      return;
    }
  }
  absl::Status s = Kubelet::Finish(*options_.node, options_.scenario->NamespaceOf(name), name);
  MutexLock l(&options_.book->mutex);
  SimPod& p = options_.book->pods[name];
  if (!s.ok()) {
    options_.tasks->Post(Now() + absl::Milliseconds(300), [this, name] { FinishTask(name); });
    return;
  }
  if (p.stage == Stage::kRunning) {
    p.stage = Stage::kSucceeded;
    p.left_at = Now();
    ++options_.book->result.completed;
    // A TTL controller removes finished pods a moment later.
    options_.tasks->Post(Now() + absl::Seconds(1), [this, name] { CleanupTask(name); });
  }
}

void PodPipeline::CleanupTask(const std::string& name) {
  absl::Status s = DeletePod(*options_.api, options_.scenario->NamespaceOf(name), name, 0);
  MutexLock l(&options_.book->mutex);
  SimPod& p = options_.book->pods[name];
  if (!s.ok()) {
    options_.tasks->Post(Now() + absl::Milliseconds(500), [this, name] { CleanupTask(name); });
    return;
  }
  if (p.stage != Stage::kGone) {
    p.stage = Stage::kGone;
    ++options_.book->result.deleted;
  }
}

void PodPipeline::DeleteTask(const std::string& name, bool force) {
  Stage before;
  {
    MutexLock l(&options_.book->mutex);
    auto it = options_.book->pods.find(name);
    if (it == options_.book->pods.end()) {
      return;
    }
    before = it->second.stage;
    if (before != Stage::kPending && before != Stage::kBound && before != Stage::kRunning) {
      return;
    }
    it->second.stage = Stage::kDeleting;
  }
  // Graceful (30 s) unless forced: a forced delete removes the pod at once, with one DELETED
  // event and no update before it.
  absl::Status s =
      DeletePod(*options_.api, options_.scenario->NamespaceOf(name), name, force ? 0 : -1);
  MutexLock l(&options_.book->mutex);
  SimPod& p = options_.book->pods[name];
  if (!s.ok()) {
    p.stage = before;  // try another time
    return;
  }
  if (before == Stage::kPending || force) {
    // Unbound or forced: gone at once (a bind racing with it fails on the server).
    p.stage = Stage::kGone;
    p.left_at = std::min(p.left_at, Now());
    ++options_.book->result.deleted;
    return;
  }
  // The kubelet stops the containers, then reports the pod terminal; the API server then
  // removes it (graceful deletion; on a real one the kubelet's DELETE with grace 0 does).
  options_.book->terminating.insert(name);
  options_.tasks->Post(Now() + absl::Milliseconds(300), [this, name] { TerminateTask(name); });
}

void PodPipeline::TerminateTask(const std::string& name) {
  absl::Status s = Kubelet::Finish(*options_.node, options_.scenario->NamespaceOf(name), name);
  if (options_.real && (s.ok() || absl::IsNotFound(s))) {
    // A real API server keeps a gracefully deleted pod until its kubelet deletes it with grace
    // 0 once the containers stopped.
    s = DeletePod(*options_.node, options_.scenario->NamespaceOf(name), name, 0);
  }
  MutexLock l(&options_.book->mutex);
  SimPod& p = options_.book->pods[name];
  if (!s.ok()) {
    options_.tasks->Post(Now() + absl::Milliseconds(500), [this, name] { TerminateTask(name); });
    return;
  }
  p.left_at = std::min(p.left_at, Now());
  if (p.stage != Stage::kGone) {
    p.stage = Stage::kGone;
    ++options_.book->result.deleted;
  }
}

void PodPipeline::DeleteRandomLive(int n, bool force) {
  for (std::string& name : PickLive(n, /*bound_only=*/force)) {
    options_.tasks->Post(Now(), [this, name, force] { DeleteTask(name, force); });
  }
}

std::vector<std::string> PodPipeline::PickLive(int n, bool bound_only) {
  std::vector<std::string> picked;
  {
    MutexLock l(&options_.book->mutex);
    for (int attempt = 0; attempt < n * 20 && static_cast<int>(picked.size()) < n; ++attempt) {
      if (options_.book->pod_names.empty()) {
        break;
      }
      const std::string& name = options_.book->pod_names[Rand() % options_.book->pod_names.size()];
      const Stage st = options_.book->pods[name].stage;
      if ((st == Stage::kRunning || st == Stage::kBound ||
           (st == Stage::kPending && !bound_only)) &&
          std::find(picked.begin(), picked.end(), name) == picked.end()) {
        picked.push_back(name);
      }
    }
  }
  return picked;
}

}  // namespace tessera::sim
