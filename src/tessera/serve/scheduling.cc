#include "tessera/serve/scheduling.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/base/logging.h"
#include "tessera/device/annotations.h"
#include "tessera/extender/disruption_budgets.h"
#include "tessera/extender/verdict.h"

namespace tessera::serve {

namespace {

// The label of an unschedulable filter in tessera_filter_decisions_total{reason}: the reason
// most failed candidates give, each device reason of a node counted once by name
// ("CardInsufficientMemory" for HAMi's "2/8 CardInsufficientMemory"), a node-level reason by its
// label ("node unregistered"), ties broken by name. Bounded by the fixed set of reasons, never
// a node or pod name.
std::string_view CommonFailureReason(const std::vector<extender::FailedNode>& failed_nodes) {
  return failed_nodes.empty() ? std::string_view() : extender::MainReason(failed_nodes);
}

metrics::FilterOutcome FilterOutcomeOf(extender::FilterCode code) {
  switch (code) {
    case extender::FilterCode::kFit:
      return metrics::FilterOutcome::kScheduled;
    case extender::FilterCode::kNoFit:
      return metrics::FilterOutcome::kUnschedulable;
    case extender::FilterCode::kPassThrough:
      return metrics::FilterOutcome::kPassthrough;
    case extender::FilterCode::kError:
      return metrics::FilterOutcome::kError;
  }
  return metrics::FilterOutcome::kError;
}

// tessera_bind_total{outcome}: refusals that leave the cluster as it was are "rejected",
// failed API calls "error".
metrics::BindOutcome BindOutcomeOf(extender::BindCode code) {
  switch (code) {
    case extender::BindCode::kBound:
      return metrics::BindOutcome::kBound;
    case extender::BindCode::kPodNotFound:
    case extender::BindCode::kInProgress:
    case extender::BindCode::kNotOurs:
    case extender::BindCode::kNodeUnregistered:
    case extender::BindCode::kNoAllocation:
    case extender::BindCode::kLockHeld:
    case extender::BindCode::kDevicesNotFree:
    case extender::BindCode::kBindingRejected:
      return metrics::BindOutcome::kRejected;
    case extender::BindCode::kLockError:
    case extender::BindCode::kPatchFailed:
    case extender::BindCode::kError:
      return metrics::BindOutcome::kError;
  }
  return metrics::BindOutcome::kError;
}

}  // namespace

bool Withheld(const accounting::NodeRegistry& registry, std::string_view node) {
  const std::optional<accounting::NodeStatus> status = registry.Find(node);
  return status && status->in_ledger &&
         status->availability != accounting::Availability::kAvailable;
}

Scheduling::Scheduling(const ServeOptions& options, Parts parts)
    : parts_(parts), mode_(options.preemption) {
  extender::Scheduler::Options scheduler_options;
  scheduler_options.scheduler_name = options.scheduler_name;
  scheduler_options.node_policy = options.node_policy;
  scheduler_options.gpu_policy = options.gpu_policy;
  scheduler_options.node_lock_timeout = options.node_lock_timeout;
  scheduler_options.node_lock_retry_timeout = options.node_lock_retry_timeout;
  // Pauses between lock tries (409 backoff, the wait for a held lock) end at Stop, and a
  // waiting bind then gives up, so Stop does not wait out --node-lock-retry-timeout.
  scheduler_options.lock.sleep = [inbox = parts.inbox](absl::Duration d) { inbox->Pause(d); };
  scheduler_options.lock.stopping = [inbox = parts.inbox] { return inbox->stopping(); };
  // A bind waiting for a lock holds an HTTP worker: leave half of them to /filter.
  scheduler_options.max_lock_waiters = std::max(1, static_cast<int>(options.http_threads / 2));
  scheduler_options.reservation_ttl = options.reservation_ttl;
  scheduler_options.patch_threads = options.patch_threads;
  scheduler_options.vendor = parts.vendor;
  scheduler_options.avoid_busy_nodes = options.avoid_busy_nodes;
  // Verdicts are written by the leader only (like every background write).
  scheduler_options.is_leader = [leadership = parts.leadership] { return leadership->IsLeader(); };
  scheduler_options.withheld = [registry = parts.registry](std::string_view node) {
    return Withheld(*registry, node);
  };
  const kube::Store<kube::Node>& nodes = parts.informers->nodes().store();
  scheduler_options.node_lock = [&nodes](std::string_view name) {
    auto node = nodes.Get(name);
    if (node == nullptr) {
      return extender::BusyNodes::NodeView{};
    }
    return extender::BusyNodes::NodeView{
        .lock = std::string(node->meta.annotations.Get(device::kNodeLockAnnotation)),
        .resource_version = node->meta.resource_version};
  };
  // The node informer's copy saves the GET of an unlocked node in bind.
  scheduler_options.lock.cached = [&nodes](std::string_view name) -> std::optional<kube::Node> {
    auto node = nodes.Get(name);
    if (node == nullptr) {
      return std::nullopt;
    }
    return *node;
  };
  extender::Scheduler::Deps deps;
  deps.ledger = parts.ledger;
  deps.quotas = parts.quotas;
  deps.client = parts.client;
  deps.clock = parts.clock;
  const kube::Store<kube::Pod>& pods = parts.informers->pods().store();
  deps.lookup = [&pods](std::string_view ns, std::string_view name) -> std::optional<kube::Pod> {
    auto pod = pods.Get(std::string(ns) + "/" + std::string(name));
    if (pod == nullptr) {
      return std::nullopt;
    }
    return *pod;
  };
  preemptor_ = std::make_unique<extender::Preemptor>(extender::Preemptor::Deps{
      .ledger = parts.ledger,
      .lookup = deps.lookup,
      .vendor = parts.vendor,
      .config = {.node_policy = options.node_policy,
                 .gpu_policy = options.gpu_policy,
                 .quotas = parts.quotas},
      .budget_violations = [client = parts.client](std::string_view node,
                                                   const std::vector<const kube::Pod*>& victims) {
        return extender::BudgetViolations(client, node, victims);
      }});
  if (mode_ == PreemptionMode::kSelf) {
    scheduler_options.refused = [this](const kube::Pod& pod, std::vector<std::string> names) {
      self_preemptor_->Refused(pod, std::move(names));
    };
  }
  const extender::PodLookup lookup = deps.lookup;
  scheduler_ = std::make_unique<extender::Scheduler>(scheduler_options, std::move(deps));
  if (mode_ == PreemptionMode::kSelf) {
    self_preemptor_ = std::make_unique<extender::SelfPreemptor>(
        options.self_preempt, extender::SelfPreemptor::Deps{.preemptor = preemptor_.get(),
                                                            .scheduler = scheduler_.get(),
                                                            .client = parts.client,
                                                            .clock = parts.clock,
                                                            .lookup = lookup});
  }
}

extender::FilterResult Scheduling::Filter(const extender::FilterArgs& args) {
  const absl::Time start = parts_.clock->Now();
  extender::FilterResult result;
  if (!parts_.informers->Synced()) {
    result.node_names = std::vector<std::string>();
    result.error = "tessera is not ready: " + parts_.informers->SyncState();
    parts_.metrics->RecordFilter(metrics::FilterOutcome::kError, "not_synced",
                                 parts_.clock->Now() - start);
    return result;
  }
  extender::FilterOutcome outcome;
  result = scheduler_->Filter(args, &outcome);
  const std::string_view reason = outcome.code == extender::FilterCode::kNoFit
                                      ? CommonFailureReason(outcome.failed_nodes)
                                      : std::string_view();
  parts_.metrics->RecordFilter(FilterOutcomeOf(outcome.code), reason, parts_.clock->Now() - start);
  return result;
}

extender::BindResult Scheduling::Bind(const extender::BindArgs& args) {
  const absl::Time start = parts_.clock->Now();
  extender::BindOutcome outcome;
  extender::BindResult result = scheduler_->Bind(args, &outcome);
  parts_.metrics->RecordBind(BindOutcomeOf(outcome.code), parts_.clock->Now() - start);
  return result;
}

// Only the leader moves an allocation: a refit decides under the decision lock of the replica
// that answers it, and only the leader's lock orders it against the filters of the
// kube-scheduler that schedules (docs/serve.md "NUMA refit").
extender::RefitResponse Scheduling::Refit(const extender::RefitRequest& request) {
  extender::RefitResponse response;
  if (!parts_.informers->Synced()) {
    response.failure_reason = "tessera is not ready: " + parts_.informers->SyncState();
  } else if (!parts_.leadership->IsLeader()) {
    response.failure_reason = fmt::format(
        "this replica is not the leader ({}): only the leader refits; point the device plugin "
        "at the leader (hami.io/scheduler-role=leader)",
        parts_.leadership->Describe());
  } else {
    return scheduler_->Refit(request);
  }
  TESSERA_VLOGS(2, "refit", "pod", request.pod_namespace + "/" + request.pod_name, "outcome",
                response.failure_reason);
  return response;
}

absl::StatusOr<extender::PreemptResult> Scheduling::Preempt(const extender::PreemptArgs& args) {
  if (mode_ == PreemptionMode::kOff) {
    return absl::UnimplementedError("preemption is turned off (--preemption=off)");
  }
  if (!parts_.informers->Synced()) {
    parts_.metrics->RecordPreempt(metrics::PreemptOutcome::kError, 0);
    return absl::UnavailableError("tessera is not ready: " + parts_.informers->SyncState());
  }
  extender::PreemptOutcome outcome;
  absl::StatusOr<extender::PreemptResult> result = preemptor_->Preempt(args, &outcome);
  const std::string pod = args.pod.Key();
  if (!result.ok()) {
    parts_.metrics->RecordPreempt(metrics::PreemptOutcome::kError, 0);
    TESSERA_LOGS(kWarning, "preempt refused", "pod", pod, "err",
                 std::string(result.status().message()));
    return result;
  }
  int64_t victims = 0;
  std::string added;
  for (const auto& [node, pods] : outcome.added) {
    victims += static_cast<int64_t>(pods.size());
    if (!pods.empty()) {
      added +=
          fmt::format("{}{}=[{}]", added.empty() ? "" : " ", node, extender::VictimNames(pods));
    }
  }
  parts_.metrics->RecordPreempt(result->victims.empty() ? metrics::PreemptOutcome::kNoNode
                                : victims > 0           ? metrics::PreemptOutcome::kVictims
                                                        : metrics::PreemptOutcome::kNoVictims,
                                victims);
  if (outcome.stored) {
    // The verdict of its next refusal says why preemption did not help (or nothing if it did),
    // and kube-scheduler evicts on one of the nodes kept: the share that frees there is held for
    // the pod (docs/preemption.md "The nominated reservation").
    scheduler_->NotePreemption(args.pod.meta.uid, extender::PreemptionNote(outcome, *result));
    if (!outcome.pass_through) {
      std::vector<std::string> kept;
      kept.reserve(result->victims.size());
      for (const auto& [node, wire] : result->victims) {
        kept.push_back(node);
      }
      scheduler_->Nominate(args.pod, std::move(kept));
    }
  }
  if (outcome.pass_through || outcome.never) {
    TESSERA_VLOGS(2, "preempt", "pod", pod, "outcome",
                  outcome.never ? "preemptionPolicy Never" : "no managed device");
    return result;
  }
  TESSERA_LOGS(kInfo, "preempt", "pod", pod, "offered", args.victims.size(), "kept",
               result->victims.size(), "added", added, "dropped",
               fmt::format("{}", fmt::join(outcome.dropped, ",")));
  // The pod's owner sees the answer: which pods would go where (kube-scheduler picks the node
  // and evicts; it posts Preempted on the victims), or that no eviction frees a share. Only
  // about a pod the informer knows by that uid: a body naming anything else gets no event.
  if (!outcome.stored) {
    return result;
  }
  if (result->victims.empty()) {
    if (!outcome.dropped.empty()) {
      extender::EventNodeList nodes(
          "no eviction of lower-priority pods frees a GPU share for this pod on ", ", ");
      for (const std::string& node : outcome.dropped) {
        nodes.Add(node);
      }
      scheduler_->events().Record(args.pod.meta, "PreemptionNotHelpful", std::move(nodes).Finish(),
                                  extender::EventType::kWarning);
    }
  } else if (victims > 0) {
    scheduler_->events().Record(args.pod.meta, "PreemptionVictimsProposed",
                                "to free a GPU share, Tessera proposes evicting: " + added,
                                extender::EventType::kNormal);
  }
  return result;
}

}  // namespace tessera::serve
