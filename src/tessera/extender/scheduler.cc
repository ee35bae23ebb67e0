#include "tessera/extender/scheduler.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include <fmt/core.h>

#include "tessera/accounting/projection.h"
#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/device/mig_usage.h"
#include "tessera/extender/verdict.h"
#include "tessera/schedule/fit.h"
#include "tessera/schedule/score.h"

namespace tessera::extender {
namespace {

// FilterArgs::CandidateNames, implemented here so that this library needs only wire.h's types.
std::vector<std::string> CandidateNames(const FilterArgs& args) {
  if (args.node_names) {
    return *args.node_names;
  }
  std::vector<std::string> names;
  if (args.nodes) {
    names.reserve(args.nodes->size());
    for (const WireNode& n : *args.nodes) {
      names.push_back(n.node.meta.name);
    }
  }
  return names;
}

// The reason names of one failed node, for events: the parts' names, or the whole
// reason when it has no parts ("node unregistered").
std::vector<std::string> ReasonKeys(const schedule::NodeResult& r) {
  std::vector<std::string> keys;
  for (const schedule::ReasonPart& p : r.reasons) {
    keys.emplace_back(schedule::ReasonName(p.reason));
  }
  if (keys.empty()) {
    keys.push_back(r.reason.empty() ? std::string("node not fit pod") : r.reason);
  }
  return keys;
}

kube::MetadataPatch ToPatch(const kube::StringMap& annotations, const kube::StringMap& labels) {
  kube::MetadataPatch patch;
  for (const auto& [k, v] : annotations) {
    patch.annotations.emplace_back(k, v);
  }
  for (const auto& [k, v] : labels) {
    patch.labels.emplace_back(k, v);
  }
  return patch;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

}  // namespace

std::string_view FilterCodeName(FilterCode code) {
  switch (code) {
    case FilterCode::kFit:
      return "fit";
    case FilterCode::kNoFit:
      return "no_fit";
    case FilterCode::kPassThrough:
      return "pass_through";
    case FilterCode::kError:
      return "error";
  }
  return "error";
}

std::string_view BindCodeName(BindCode code) {
  switch (code) {
    case BindCode::kBound:
      return "bound";
    case BindCode::kInProgress:
      return "in_progress";
    case BindCode::kPodNotFound:
      return "pod_not_found";
    case BindCode::kNotOurs:
      return "not_ours";
    case BindCode::kNodeUnregistered:
      return "node_unregistered";
    case BindCode::kNoAllocation:
      return "no_allocation";
    case BindCode::kLockHeld:
      return "lock_held";
    case BindCode::kLockError:
      return "lock_error";
    case BindCode::kDevicesNotFree:
      return "devices_not_free";
    case BindCode::kPatchFailed:
      return "patch_failed";
    case BindCode::kBindingRejected:
      return "binding_rejected";
    case BindCode::kError:
      return "error";
  }
  return "error";
}

namespace {

// A decision's devices for the -v=2 filter line: containers separated by ";", each device as
// "UUID:MiB:cores" — built only when that line is logged.
std::string DevicesForLog(const std::vector<device::ContainerDevices>& containers) {
  std::string out;
  for (size_t c = 0; c < containers.size(); ++c) {
    if (c > 0) {
      out += ';';
    }
    for (size_t d = 0; d < containers[c].size(); ++d) {
      const device::ContainerDevice& dev = containers[c][d];
      out += fmt::format("{}{}:{}:{}", d > 0 ? "," : "", dev.uuid, dev.usedmem, dev.usedcores);
    }
  }
  return out;
}

size_t CandidateCount(const FilterArgs& args) {
  return args.node_names ? args.node_names->size() : args.nodes ? args.nodes->size() : 0;
}

// Why `pod` can no longer be given a decision: bound, being deleted or finished; OK when none.
absl::Status NotPending(const kube::Pod& pod) {
  if (!pod.node_name.empty()) {
    return absl::FailedPreconditionError(
        fmt::format("pod {} is already bound to node {}: only a pending pod can be filtered",
                    pod.Key(), pod.node_name));
  }
  if (pod.Deleting()) {
    return absl::FailedPreconditionError(
        fmt::format("pod {} is being deleted: only a pending pod can be filtered", pod.Key()));
  }
  if (pod.Terminal()) {
    return absl::FailedPreconditionError(
        fmt::format("pod {} has finished (phase {}): only a pending pod can be filtered", pod.Key(),
                    kube::PodPhaseName(pod.phase)));
  }
  return absl::OkStatus();
}

// Whether `body` (the request's pod decoded) asks for exactly what `stored` asks for.
bool SameAsks(const absl::StatusOr<device::PodRequest>& body, const device::PodRequest& stored) {
  return body.ok() && body->init_count == stored.init_count &&
         body->containers == stored.containers;
}

}  // namespace

Scheduler::Scheduler(Options options, Deps deps)
    : options_(std::move(options)),
      ledger_(deps.ledger),
      quotas_(deps.quotas),
      client_(deps.client),
      clock_(deps.clock != nullptr ? deps.clock : Clock::Real()),
      lookup_(std::move(deps.lookup)),
      busy_(
          options_.node_lock, [this](std::string_view uid) { return ledger_->HasReservation(uid); },
          // From the pod cache only (no API call in /filter); without one a lock counts as held.
          [this](std::string_view ns, std::string_view name) {
            if (!lookup_) {
              return false;
            }
            std::optional<kube::Pod> holder = lookup_(ns, name);
            return !holder.has_value() || holder->Terminal();
          },
          options_.node_lock_timeout),
      events_({.component = options_.scheduler_name, .queue_limit = options_.event_queue_limit},
              client_, clock_),
      verdicts_({}, client_, &events_),
      patches_(
          {.threads = options_.write_behind ? std::max(options_.patch_threads, 1) : 0,
           .wait = options_.patch_wait},
          client_,
          [this](const PatchWriter::Job& job, const absl::Status& status) {
            SettlePatch(job, status);
          },
          NotPending) {
  TESSERA_CHECK(options_.vendor != nullptr);
  TESSERA_CHECK(ledger_ != nullptr);
}

Scheduler::~Scheduler() = default;

// ---- filter -------------------------------------------------------------------------------

void Scheduler::OfferVerdict(const kube::Pod& pod, const device::PodRequest& request,
                             const std::vector<schedule::Candidate>& candidates,
                             const cycle::Diagnosis& diagnosis, std::string_view checked_version) {
  if (!options_.verdicts || (options_.is_leader && !options_.is_leader())) {
    return;
  }
  std::function<std::string(std::string_view)> lock_of;
  if (options_.node_lock) {
    lock_of = [this](std::string_view node) { return options_.node_lock(node).lock; };
  }
  const Verdict verdict = BuildVerdict(diagnosis, {.request = &request,
                                                   .candidates = candidates,
                                                   .ledger = ledger_,
                                                   .lock_of = std::move(lock_of),
                                                   .withheld = options_.withheld});
  verdicts_.Offer(pod.meta, checked_version, verdict.reason, EncodeVerdict(verdict));
}

FilterResult Scheduler::Filter(const FilterArgs& args, FilterOutcome* outcome) {
  const bool simulated = args.nodes && !args.node_names;
  // The request body's pod is the caller's word; the stored pod of the same uid decides
  // (docs/serve.md "Filter and bind"): the cache's copy now, else the API server's after the
  // pending check. A simulated request reserves and writes nothing: its body decides.
  std::optional<kube::Pod> stored;
  if (!simulated && !args.pod.meta.uid.empty() && lookup_) {
    stored = lookup_(args.pod.meta.ns, args.pod.meta.name);
    if (stored && stored->meta.uid != args.pod.meta.uid) {
      stored.reset();  // another pod of that name: CheckPending asks the API server
    }
  }
  const kube::Pod* decided = stored ? &*stored : &args.pod;
  FilterResult result;
  FilterOutcome local;
  FilterOutcome& out = outcome != nullptr ? *outcome : local;
  out = FilterOutcome();
  out.simulated = simulated;
  auto fail = [&](const absl::Status& s) {
    result = FilterResult();
    result.error = Message(s);
    if (!simulated) {
      events_.Record(decided->meta, "FilteringFailed", result.error, EventType::kWarning);
    }
    out.code = FilterCode::kError;
    out.failed_nodes.clear();
    TESSERA_VLOGS(2, "filter", "pod", decided->Key(), "candidates", CandidateCount(args), "node",
                  "", "err", result.error);
    return result;
  };

  // The pod asks for no managed device: the input is echoed. A reservation cannot exist for
  // such a pod unless its spec changed; drop it if it does.
  auto pass_through = [&] {
    if (!decided->meta.uid.empty() && !simulated) {
      ledger_->Release(decided->meta.uid);
    }
    if (args.node_names) {
      result.node_names = args.node_names;
    } else if (args.nodes) {
      std::vector<std::string> raws;
      for (const WireNode& n : *args.nodes) {
        raws.push_back(n.raw);
      }
      result.nodes = std::move(raws);
    } else {
      result.node_names.emplace();
    }
    out.code = FilterCode::kPassThrough;
    TESSERA_VLOGS(2, "filter", "pod", decided->Key(), "candidates", CandidateCount(args), "node",
                  "", "outcome", "passthrough (no managed device asked for)");
    return result;
  };

  cycle::Decoded decoded = cycle::Decode(*options_.vendor, *decided, cycle::DecodeMode::kFilter);
  if (decoded.code == cycle::DecodeCode::kError) {
    return fail(decoded.error);
  }
  if (decoded.code == cycle::DecodeCode::kPassThrough) {
    return pass_through();
  }
  if (simulated) {
    return FilterNodes(args, *decided, decoded, &out);
  }
  if (decided->meta.uid.empty()) {
    return fail(absl::InvalidArgumentError(
        fmt::format("pod {} has no metadata.uid: cannot reserve for it", decided->Key())));
  }
  absl::StatusOr<std::string> checked_version = CheckPending(args.pod, &stored);
  if (!checked_version.ok()) {
    return fail(checked_version.status());
  }
  if (decided != &*stored) {
    // The cache did not have it: the API server's copy, read by the check, decides.
    decided = &*stored;
    decoded = cycle::Decode(*options_.vendor, *decided, cycle::DecodeMode::kStrict);
    if (decoded.code == cycle::DecodeCode::kError) {
      return fail(decoded.error);
    }
  }
  out.stale_body = !SameAsks(options_.vendor->DecodeRequest(args.pod), decoded.request) ||
                   options_.vendor->DecodeConstraints(args.pod).value_or(
                       device::PodConstraints()) != decoded.constraints;
  if (out.stale_body) {
    TESSERA_LOGS(kWarning,
                 "Filter request's pod asks for other devices than the stored pod of its uid; "
                 "deciding on the stored pod",
                 "pod", decided->Key(), "uid", decided->meta.uid);
  }
  if (decoded.request.Empty()) {
    return pass_through();  // the body claimed a device the stored pod does not ask for
  }

  std::vector<std::string> names = CandidateNames(args);
  const absl::Time now = clock_->Now();
  std::vector<schedule::Candidate> candidates(names.size());
  const BusyNodes::Pod asking{decided->meta.uid, decided->meta.ns, decided->meta.name};
  for (size_t i = 0; i < names.size(); ++i) {
    candidates[i].busy = options_.avoid_busy_nodes && busy_.Busy(names[i], asking, now);
    candidates[i].name = std::move(names[i]);
  }
  cycle::Result run;
  const schedule::Decision& decision = run.decision;
  uint64_t seq = 0;
  {
    MutexLock l(&decide_mu_);
    // The pod's earlier decision no longer holds: it must not compete with itself.
    ledger_->Release(decided->meta.uid);
    filter_seq_.erase(decided->meta.uid);
    // Snapshot, quota, decide and reserve under one lock: two filters never reserve the same
    // capacity nor, in one namespace, pass its quota together. Diagnosed after the lock.
    run = cycle::Run(cycle_config_,
                     {.pod = decided,
                      .request = &decoded.request,
                      .constraints = &decoded.constraints,
                      .ledger = ledger_,
                      .reserve_in = ledger_,
                      .expiry = now + options_.reservation_ttl,
                      .diagnose = false},
                     &candidates);
    if (decision.winner) {
      if (!run.reserved.ok()) {
        return fail(run.reserved);
      }
      seq = ++next_seq_;
      filter_seq_[decided->meta.uid] = seq;
      busy_.Decided(decided->meta.uid, candidates[*decision.winner].name,
                    now + options_.reservation_ttl);
    } else {
      busy_.Ended(decided->meta.uid);
    }
  }

  if (!decision.winner) {
    result.node_names.emplace();
    cycle::Diagnosis diagnosis = cycle::Diagnose(candidates, decision, run.quota);
    std::map<std::string, std::vector<std::string>> by_reason;  // reason → nodes (for events)
    for (size_t k = 0; k < diagnosis.failed.size(); ++k) {
      const std::string& node = diagnosis.failed[k].node;
      const schedule::NodeResult& r = decision.nodes[diagnosis.at[k]];
      result.failed_nodes.insert_or_assign(node, r.reason);
      for (std::string& key : ReasonKeys(r)) {
        by_reason[std::move(key)].push_back(node);
      }
    }
    for (auto& [reason, nodes] : by_reason) {
      std::sort(nodes.begin(), nodes.end());
      nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
      EventNodeList list(fmt::format("{} nodes {}", nodes.size(), reason), ", ");
      for (const std::string& n : nodes) {
        list.Add(n);
      }
      events_.Record(decided->meta, "FilteringFailed", std::move(list).Finish(),
                     EventType::kWarning);
    }
    if (candidates.empty()) {
      events_.Record(decided->meta, "FilteringFailed", "no candidate nodes", EventType::kWarning);
    }
    if (!diagnosis.quota.empty()) {
      events_.Record(decided->meta, "FilteringFailed", diagnosis.quota, EventType::kWarning);
    }
    OfferVerdict(*decided, decoded.request, candidates, diagnosis, *checked_version);
    out.failed_nodes = std::move(diagnosis.failed);
    out.quota = std::move(diagnosis.quota);
    out.code = FilterCode::kNoFit;
    TESSERA_VLOGS(2, "filter", "pod", decided->Key(), "candidates", candidates.size(), "node", "",
                  "outcome", "no node fits");
    return result;
  }

  const std::string& winner = candidates[*decision.winner].name;
  PatchWriter::Job job;
  job.ns = decided->meta.ns;
  job.name = decided->meta.name;
  job.uid = decided->meta.uid;
  job.seq = seq;
  job.created = now;
  job.patch = ToPatch(
      device::FilterAnnotations(*options_.vendor, winner, decision.devices, now, decision.mig),
      device::FilterLabels(winner));
  job.patch.uid = decided->meta.uid;  // this pod, never another of the same name
  if (decision.mig.empty() &&
      decided->meta.annotations.Find(device::kMigAllocationsAnnotation) != nullptr) {
    // An earlier filter's MIG placements: this decision has none, so they go (HAMi leaves them,
    // and its usage rebuild then fails the pod's new cards closed; docs/compatibility.md).
    job.patch.annotations.emplace_back(std::string(device::kMigAllocationsAnnotation),
                                       std::nullopt);
  }
  // The pod has a node now: its verdict goes (merge patch null; a no-op when it has none, and
  // the pod informer does not keep the key, so it cannot say) with any queued write of it.
  verdicts_.Forget(decided->meta.uid);
  job.patch.annotations.emplace_back(std::string(device::kVerdictAnnotation), std::nullopt);
  if (!checked_version->empty()) {
    // ... and only while it is the pending pod the check saw: a pod bound meanwhile (by another
    // replica across a handover) is refused with 409, not re-annotated (PatchWriter re-checks).
    job.patch.resource_version = *std::move(checked_version);
  }
  if (options_.write_behind) {
    patches_.Submit(std::move(job));
  } else if (absl::StatusOr<kube::Pod> written = patches_.Write(job); !written.ok()) {
    return fail(written.status());
  }

  result.node_names = std::vector<std::string>{winner};
  // "<node>:<score with 2 decimals>,..." built with std::to_chars, which rounds exactly as
  // fmt's {:.2f} does: formatting each entry with fmt cost a third of the instructions of a
  // 500-candidate filter (callgrind, docs/benchmarks.md). Entries past the message limit are
  // only counted.
  size_t not_fit = 0;
  for (const schedule::NodeResult& r : decision.nodes) {
    not_fit += r.fit ? 0 : 1;
  }
  const size_t fit_count = decision.nodes.size() - not_fit;
  EventNodeList fits(
      fmt::format("find fit node({}), {} nodes not fit, {} nodes fit", winner, not_fit, fit_count),
      ",");
  std::string entry;
  for (size_t i = 0; i < decision.nodes.size(); ++i) {
    if (!decision.nodes[i].fit) {
      continue;
    }
    if (!fits.Open()) {
      fits.Omit();
      continue;
    }
    entry = candidates[i].name;
    entry += ':';
    char score[64];
    const std::to_chars_result r = std::to_chars(
        score, score + sizeof(score), decision.nodes[i].score, std::chars_format::fixed, 2);
    if (r.ec == std::errc()) {
      entry.append(score, r.ptr);
    } else {
      entry += fmt::format("{:.2f}", decision.nodes[i].score);
    }
    fits.Add(entry);
  }
  events_.Record(decided->meta, "FilteringSucceed", std::move(fits).Finish(), EventType::kNormal);
  out.code = FilterCode::kFit;
  TESSERA_VLOGS(2, "filter", "pod", decided->Key(), "candidates", candidates.size(), "fit",
                fit_count, "node", winner, "devices", DevicesForLog(decision.devices));
  return result;
}

FilterResult Scheduler::FilterNodes(const FilterArgs& args, const kube::Pod& pod,
                                    const cycle::Decoded& decoded, FilterOutcome* outcome) {
  const std::vector<WireNode>& nodes = *args.nodes;
  std::vector<schedule::Candidate> candidates(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    candidates[i].name = nodes[i].node.meta.name;
  }
  // Not in the ledger (e.g. an autoscaler template node): its own registration, unused.
  auto unknown = [&](size_t i) -> std::optional<device::NodeSnapshot> {
    absl::StatusOr<device::NodeDevices> devices = options_.vendor->DecodeNode(nodes[i].node);
    if (!devices.ok()) {
      return std::nullopt;
    }
    device::NodeSnapshot snap;
    snap.usage.resize(devices->devices.size());
    snap.devices = std::make_shared<const device::NodeDevices>(*std::move(devices));
    return snap;
  };
  cycle::Result run = cycle::Run(cycle_config_,
                                 {.pod = &pod,
                                  .request = &decoded.request,
                                  .constraints = &decoded.constraints,
                                  .ledger = ledger_,
                                  .unknown = unknown},
                                 &candidates);
  FilterResult result;
  result.nodes.emplace();
  if (run.decision.winner) {
    result.nodes->push_back(nodes[*run.decision.winner].raw);
    outcome->code = FilterCode::kFit;
    return result;
  }
  for (size_t k = 0; k < run.diagnosis.failed.size(); ++k) {
    result.failed_nodes.emplace(run.diagnosis.failed[k].node,
                                run.decision.nodes[run.diagnosis.at[k]].reason);
  }
  outcome->failed_nodes = std::move(run.diagnosis.failed);
  outcome->code = FilterCode::kNoFit;
  return result;
}

void Scheduler::SettlePatch(const PatchWriter::Job& job, const absl::Status& status) {
  {
    MutexLock l(&decide_mu_);
    auto it = filter_seq_.find(job.uid);
    if (it != filter_seq_.end() && it->second == job.seq) {
      filter_seq_.erase(it);
      if (!status.ok()) {
        ledger_->Release(job.uid);
        busy_.Ended(job.uid);
      }
    }
  }
  if (!status.ok() && options_.write_behind) {
    // Written behind the reply: the filter's event is this. (Otherwise the filter fails.)
    kube::ObjectMeta subject;
    subject.ns = job.ns;
    subject.name = job.name;
    subject.uid = job.uid;
    events_.Record(subject, "FilteringFailed", Message(status), EventType::kWarning);
  }
}

absl::StatusOr<std::string> Scheduler::CheckPending(const kube::Pod& claimed,
                                                    std::optional<kube::Pod>* stored) {
  TESSERA_RETURN_IF_ERROR(NotPending(claimed));
  std::optional<kube::Pod>& current = *stored;
  if (!current || current->meta.uid != claimed.meta.uid) {
    // Not cached, or the cache holds another pod of that name: ask the API server.
    absl::StatusOr<kube::Pod> got = client_->GetPod(claimed.meta.ns, claimed.meta.name);
    if (!got.ok()) {
      return absl::Status(got.status().code(),
                          fmt::format("pod {}: {}", claimed.Key(), Message(got.status())));
    }
    current = *std::move(got);
  }
  if (current->meta.uid != claimed.meta.uid) {
    return absl::FailedPreconditionError(
        fmt::format("pod {} has uid {}, not {}: the request names a pod that no longer exists",
                    claimed.Key(), current->meta.uid, claimed.meta.uid));
  }
  TESSERA_RETURN_IF_ERROR(NotPending(*current));
  return current->meta.resource_version;
}

// ---- bind ---------------------------------------------------------------------------------

absl::StatusOr<kube::Pod> Scheduler::FindPod(std::string_view ns, std::string_view name) {
  if (lookup_) {
    std::optional<kube::Pod> pod = lookup_(ns, name);
    if (pod) {
      return *std::move(pod);
    }
  }
  return client_->GetPod(ns, name);
}

absl::StatusOr<NodeLockHolder> Scheduler::LockHolder(std::string_view ns, std::string_view name,
                                                     bool fresh) {
  auto state = [](const kube::Pod& pod, bool from_api) {
    NodeLockHolder h;
    h.terminal = pod.Terminal();
    h.running = pod.phase == kube::PodPhase::kRunning;
    h.node_name = pod.node_name;
    h.bind_phase = std::string(pod.meta.annotations.Get(device::kBindPhaseAnnotation));
    h.fresh = from_api;
    return h;
  };
  if (!fresh && lookup_) {
    if (std::optional<kube::Pod> pod = lookup_(ns, name)) {
      return state(*pod, false);
    }
  }
  absl::StatusOr<kube::Pod> pod = client_->GetPod(ns, name);
  if (pod.ok()) {
    return state(*pod, true);
  }
  if (absl::IsNotFound(pod.status())) {
    NodeLockHolder gone;
    gone.gone = true;
    gone.fresh = true;
    return gone;
  }
  return pod.status();
}

BindResult Scheduler::Bind(const BindArgs& args, BindOutcome* outcome) {
  BindResult result;
  BindOutcome local;
  BindOutcome& out = outcome != nullptr ? *outcome : local;
  out = BindOutcome();
  kube::Pod subject;  // the event's involved object until the pod is known
  subject.meta.ns = args.pod_namespace;
  subject.meta.name = args.pod_name;
  subject.meta.uid = args.pod_uid;
  // A failure releases the pod's reservation; a refusal (the request names a pod or node that
  // is not ours to bind, or one another bind is handling) changes nothing.
  auto finish = [&](const kube::Pod& pod, BindCode code, const absl::Status& s, bool release) {
    if (release) {
      MutexLock l(&decide_mu_);
      if (!pod.meta.uid.empty()) {
        ledger_->Release(pod.meta.uid);
        binding_.erase(pod.meta.uid);
      }
      if (!args.pod_uid.empty() && args.pod_uid != pod.meta.uid) {
        ledger_->Release(args.pod_uid);
        binding_.erase(args.pod_uid);
      }
    }
    result.error = Message(s);
    events_.Record(pod.meta, "BindingFailed", result.error, EventType::kWarning);
    out.code = code;
    TESSERA_VLOGS(1, "bind", "pod", fmt::format("{}/{}", args.pod_namespace, args.pod_name), "node",
                  args.node, "outcome", BindCodeName(code), "err", result.error);
    return result;
  };
  auto fail = [&](const kube::Pod& pod, BindCode code, const absl::Status& s) {
    return finish(pod, code, s, /*release=*/true);
  };
  auto refuse = [&](const kube::Pod& pod, BindCode code, const absl::Status& s) {
    return finish(pod, code, s, /*release=*/false);
  };
  if (!kube::IsDnsSubdomain(args.pod_name) || !kube::IsDnsLabel(args.pod_namespace) ||
      !kube::IsDnsSubdomain(args.node)) {
    // The HTTP layer refuses these (DecodeBindArgs); no API path is built from them here either,
    // and no event, which would have no pod to name.
    result.error = fmt::format("bind of pod \"{}/{}\" to node \"{}\": not valid Kubernetes names",
                               absl::CEscape(args.pod_namespace), absl::CEscape(args.pod_name),
                               absl::CEscape(args.node));
    out.code = BindCode::kError;
    return result;
  }

  const std::string key = args.pod_namespace + "/" + args.pod_name;
  {
    MutexLock l(&decide_mu_);
    if (!binds_in_flight_.insert(key).second) {
      return refuse(
          subject, BindCode::kInProgress,
          absl::AbortedError(fmt::format(
              "a bind of pod {} is already in progress; this duplicate changes nothing", key)));
    }
  }
  struct InFlight {
    Scheduler* self;
    const std::string& key;
    const BindArgs& args;
    const BindOutcome& out;
    ~InFlight() {
      // Bound, the node is busy with the lock the bind took (busy_nodes.h); else no longer.
      if (out.code == BindCode::kBound) {
        self->busy_.Bound(args.pod_uid, args.node, out.lock_version,
                          self->clock_->Now() + self->options_.busy_after_bind);
      } else {
        self->busy_.Ended(args.pod_uid);
      }
      MutexLock l(&self->decide_mu_);
      self->binds_in_flight_.erase(key);
    }
  } in_flight{this, key, args, out};

  // The filter's patch, written behind its reply: it must have landed, and the pod it
  // returned is the freshest copy there is (no GET needed).
  std::optional<kube::Pod> from_patch;
  if (!args.pod_uid.empty()) {
    if (std::optional<PatchWriter::Landed> landed = patches_.Take(args.pod_uid)) {
      if (!landed->done) {
        return fail(
            subject, BindCode::kError,
            absl::DeadlineExceededError(fmt::format(
                "the filter's annotation patch of {}/{} is still in flight after {}",
                args.pod_namespace, args.pod_name, absl::FormatDuration(options_.patch_wait))));
      }
      if (!landed->status.ok()) {
        return fail(subject, BindCode::kPatchFailed, landed->status);
      }
      from_patch = std::move(landed->pod);
    }
  }
  absl::StatusOr<kube::Pod> pod = from_patch ? absl::StatusOr<kube::Pod>(*std::move(from_patch))
                                             : FindPod(args.pod_namespace, args.pod_name);
  if (!pod.ok()) {
    return fail(subject, absl::IsNotFound(pod.status()) ? BindCode::kPodNotFound : BindCode::kError,
                pod.status());
  }
  // A cached copy may predate the filter's patch or belong to an earlier pod of the same name.
  const bool stale = (!args.pod_uid.empty() && pod->meta.uid != args.pod_uid) ||
                     pod->meta.annotations.Get(device::kVgpuNodeAnnotation) != args.node;
  if (stale && lookup_) {
    absl::StatusOr<kube::Pod> fresh = client_->GetPod(args.pod_namespace, args.pod_name);
    if (!fresh.ok()) {
      return fail(subject,
                  absl::IsNotFound(fresh.status()) ? BindCode::kPodNotFound : BindCode::kError,
                  fresh.status());
    }
    pod = std::move(fresh);
  }
  if (!args.pod_uid.empty() && pod->meta.uid != args.pod_uid) {
    return fail(subject, BindCode::kPodNotFound,
                absl::NotFoundError(fmt::format("pod {}/{} has uid {}, not {}: it was recreated",
                                                args.pod_namespace, args.pod_name, pod->meta.uid,
                                                args.pod_uid)));
  }
  // Only Tessera's pods, on nodes it knows, are bound here (kube-scheduler binds the rest: the
  // scheduler configuration's managedResources send only pods asking for a managed device).
  if (!options_.scheduler_name.empty() && pod->scheduler_name != options_.scheduler_name) {
    return refuse(
        *pod, BindCode::kNotOurs,
        absl::FailedPreconditionError(fmt::format(
            "pod {} names scheduler \"{}\", not \"{}\": this extender binds only its own pods",
            pod->Key(), pod->scheduler_name, options_.scheduler_name)));
  }
  absl::StatusOr<device::PodRequest> request = options_.vendor->DecodeRequest(*pod);
  if (!request.ok()) {
    return refuse(*pod, BindCode::kError, request.status());
  }
  if (request->Empty()) {
    return refuse(*pod, BindCode::kNotOurs,
                  absl::FailedPreconditionError(fmt::format(
                      "pod {} asks for no device this scheduler manages: kube-scheduler binds it "
                      "(list the device resources in the extender's managedResources)",
                      pod->Key())));
  }
  if (!pod->node_name.empty()) {
    return refuse(*pod, BindCode::kBindingRejected,
                  absl::FailedPreconditionError(fmt::format("pod {} is already assigned to node {}",
                                                            pod->Key(), pod->node_name)));
  }
  if (pod->Deleting()) {
    return refuse(*pod, BindCode::kBindingRejected,
                  absl::FailedPreconditionError(
                      fmt::format("pod {} is being deleted: it cannot be bound", pod->Key())));
  }
  if (std::vector<std::optional<device::NodeSnapshot>> snap = ledger_->Snapshot({args.node});
      !snap[0] || !snap[0]->devices) {
    return refuse(*pod, BindCode::kNodeUnregistered,
                  absl::FailedPreconditionError(fmt::format(
                      "node {} is not registered: it has no device registration this scheduler "
                      "can read, so it binds no pod there",
                      args.node)));
  }
  bool still_held = false;
  if (absl::Status bound = BindManaged(*pod, args, &out, &still_held); !bound.ok()) {
    return finish(*pod, out.code, bound, /*release=*/!still_held);
  }
  events_.Record(pod->meta, "BindingSucceed",
                 fmt::format("Successfully binding node [{}] to {}/{}", args.node, pod->meta.ns,
                             pod->meta.name),
                 EventType::kNormal);
  out.code = BindCode::kBound;
  verdicts_.Forget(pod->meta.uid);  // scheduled: no longer pending
  TESSERA_VLOGS(2, "bind", "pod", pod->Key(), "node", args.node, "devices",
                pod->meta.annotations.Get(device::kDevicesAllocatedAnnotation), "outcome", "bound");
  return result;
}

absl::Status Scheduler::PostBinding(const kube::Pod& pod, std::string_view node,
                                    const kube::ApiClient::Annotations& annotations,
                                    bool* bound_already) {
  constexpr int kPosts = 3;
  std::string version = pod.meta.resource_version;
  for (int post = 1;; ++post) {
    absl::Status b =
        client_->BindPod(pod.meta.ns, pod.meta.name, pod.meta.uid, node, annotations, version);
    if (b.ok() || !absl::IsAborted(b)) {
      return b;
    }
    absl::StatusOr<kube::Pod> now = client_->GetPod(pod.meta.ns, pod.meta.name);
    if (!now.ok() || now->meta.uid != pod.meta.uid || now->Deleting()) {
      return b;  // gone, recreated or being deleted: the 409 says it
    }
    if (!now->node_name.empty()) {
      *bound_already = true;
      return absl::AbortedError(fmt::format("pod {} is already assigned to node {} ({})", pod.Key(),
                                            now->node_name, Message(b)));
    }
    // The decision this bind checked is the one on the pod, or another scheduler replica (or a
    // newer filter) has decided again, or someone rewrote it: then this decision is not bound.
    for (std::string_view key :
         {device::kVgpuNodeAnnotation, device::kDevicesToAllocateAnnotation,
          device::kDevicesAllocatedAnnotation, device::kMigAllocationsAnnotation}) {
      if (now->meta.annotations.Get(key) != pod.meta.annotations.Get(key)) {
        return absl::FailedPreconditionError(fmt::format(
            "pod {} was filtered again since this bind read it: {} is now \"{}\" (another "
            "scheduler replica or a newer filter decided, or it was rewritten); not binding it "
            "to {}",
            pod.Key(), key, std::string(now->meta.annotations.Get(key)), node));
      }
    }
    if (post == kPosts) {
      return b;
    }
    version = now->meta.resource_version;
  }
}

absl::Status Scheduler::BindManaged(const kube::Pod& pod, const BindArgs& args,
                                    BindOutcome* outcome, bool* still_held) {
  const std::string& node = args.node;
  absl::StatusOr<ledger::PodAllocation> alloc = accounting::ProjectPod(*options_.vendor, pod);
  if (!alloc.ok()) {
    outcome->code = BindCode::kNoAllocation;
    return alloc.status();
  }
  if (alloc->node != node) {
    outcome->code = BindCode::kNoAllocation;
    return absl::FailedPreconditionError(
        alloc->node.empty()
            ? fmt::format("pod {} carries no {} annotation: it was not filtered by this scheduler",
                          pod.Key(), device::kVgpuNodeAnnotation)
            : fmt::format("pod {} was filtered to node {}, not {}", pod.Key(), alloc->node, node));
  }

  if (absl::Status decided = CheckDecided(pod, *alloc); !decided.ok()) {
    outcome->code = BindCode::kNoAllocation;
    return decided;
  }

  NodeLockOptions lock_options = options_.lock;
  lock_options.timeout = options_.node_lock_timeout;
  // Only max_lock_waiters binds at once may wait for a held lock (each holds an HTTP worker).
  const bool may_wait = lock_waiters_.fetch_add(1) < options_.max_lock_waiters;
  lock_options.wait = may_wait ? options_.node_lock_retry_timeout : absl::ZeroDuration();
  const absl::Time t_lock = absl::Now();
  absl::StatusOr<NodeLockResult> lock =
      AcquireNodeLockWaiting(client_, node, pod.meta.ns, pod.meta.name, *clock_, lock_options,
                             [this](std::string_view ns, std::string_view name, bool fresh) {
                               return LockHolder(ns, name, fresh);
                             });
  lock_waiters_.fetch_sub(1);
  if (!lock.ok()) {
    const bool held = absl::IsAborted(lock.status());
    outcome->code = held ? BindCode::kLockHeld : BindCode::kLockError;
    outcome->lock_wait = held && lock_options.wait > absl::ZeroDuration();  // and timed out
    return lock.status();
  }
  outcome->lock = lock->outcome;
  outcome->lock_version = lock->resource_version;
  outcome->lock_conflicts = lock->conflicts;
  if (lock->refusals > 0) {
    outcome->lock_wait = true;
    outcome->lock_waited = lock->waited;
  }
  if (lock->outcome != NodeLockOutcome::kAcquired && lock->took) {
    TESSERA_LOG(kInfo, "node {}: lock \"{}\" taken over for {} ({})", node, lock->previous,
                pod.Key(), NodeLockOutcomeName(lock->outcome));
  }
  // A failure releases the lock only if this bind took it: a lock that was already the pod's
  // belongs to an earlier bind of it (kube-scheduler retried), which the device plugin needs.
  auto unlock = [&] {
    if (!lock->took) {
      return;
    }
    absl::Status released =
        ReleaseNodeLock(client_, node, pod.meta.ns, pod.meta.name, lock_options);
    if (!released.ok()) {
      TESSERA_LOG(kWarning, "node {}: releasing the lock of {} failed: {}", node, pod.Key(),
                  Message(released));
    }
  };

  const absl::Time t_recheck = absl::Now();
  if (absl::Status free = Recheck(pod, node, alloc->devices, alloc->init_count, alloc->mig);
      !free.ok()) {
    unlock();
    outcome->code = BindCode::kDevicesNotFree;
    return free;
  }
  // HAMi patches bind-phase=allocating and bind-time, then posts the Binding. The Binding
  // carries them instead: the API server merges its annotations into the pod in the write that
  // sets spec.nodeName, so the device plugin (which lists the pods of its node) sees both at
  // once, a failed binding leaves no "allocating" pod behind, and a bind costs one API write
  // (and one watch event) less. docs/compatibility.md.
  const absl::Time now = clock_->Now();
  const kube::ApiClient::Annotations phase = {
      {std::string(device::kBindPhaseAnnotation), std::string(device::kBindPhaseAllocating)},
      {std::string(device::kBindTimeAnnotation), std::to_string(absl::ToUnixSeconds(now))}};
  const absl::Time t_binding = absl::Now();
  bool bound_already = false;
  if (absl::Status b = PostBinding(pod, node, phase, &bound_already); !b.ok()) {
    unlock();
    outcome->code = BindCode::kBindingRejected;
    if (bound_already) {
      // A 409 because the pod is bound already (a duplicate bind, or someone else's): its
      // devices are in use, so the reservation holds them until the informer observes the
      // binding (or bound_hold passes), as after a binding of our own.
      MutexLock l(&decide_mu_);
      if (auto it = binding_.find(pod.meta.uid); it != binding_.end()) {
        it->second = clock_->Now();
        *still_held = true;
      }
    }
    return b;
  }
  {
    // Bound: the reservation holds the devices until the informer observes it.
    MutexLock l(&decide_mu_);
    if (auto it = binding_.find(pod.meta.uid); it != binding_.end()) {
      it->second = clock_->Now();
    }
  }
  TESSERA_VLOG(2, "bind {} to {}: lock {}, re-check {}, binding {}", pod.Key(), node,
               absl::FormatDuration(t_recheck - t_lock),
               absl::FormatDuration(t_binding - t_recheck),
               absl::FormatDuration(absl::Now() - t_binding));
  return absl::OkStatus();
}

absl::Status Scheduler::CheckDecided(const kube::Pod& pod, const ledger::PodAllocation& alloc) {
  const std::optional<ledger::Reservation> reserved = ledger_->ReservationOf(pod.meta.uid);
  if (!reserved) {
    return absl::OkStatus();  // expired or never seen (a restart): the re-check decides
  }
  const ledger::Decision decided{reserved->node, reserved->devices, reserved->init_count,
                                 reserved->mig};
  auto changed = [&](std::string_view key, const ledger::Decision& carried) {
    return absl::FailedPreconditionError(fmt::format(
        "pod {}: its allocation was changed since the filter decided ({} no longer states node "
        "{} [{}]; the pod says node {} [{}]); not binding it",
        pod.Key(), key, decided.node, ledger::DecisionText(decided),
        carried.node.empty() ? "-" : carried.node, ledger::DecisionText(carried)));
  };
  const ledger::Decision carried{alloc.node, alloc.devices, alloc.init_count, alloc.mig};
  if (!ledger::SameDecision(decided, carried)) {
    // Name the annotation that differs: the node, the MIG placements, else the devices.
    std::string_view key = device::kDevicesAllocatedAnnotation;
    if (alloc.node != decided.node) {
      key = device::kVgpuNodeAnnotation;
    } else if (!ledger::SameDecision(decided, ledger::Decision{alloc.node, decided.devices,
                                                               decided.init_count, alloc.mig})) {
      key = device::kMigAllocationsAnnotation;
    }
    return changed(key, carried);
  }
  // What the device plugin hands out: the to-allocate annotation, written with the same value.
  absl::StatusOr<device::PodDevices> pending =
      device::DecodePodDevices(pod.meta.annotations.Get(options_.vendor->ToAllocateAnnotation()));
  if (!pending.ok()) {
    return changed(options_.vendor->ToAllocateAnnotation(),
                   ledger::Decision{alloc.node, {}, 0, alloc.mig, /*unreadable=*/true});
  }
  if (const ledger::Decision handed{alloc.node, *std::move(pending), alloc.init_count, alloc.mig};
      !ledger::SameDecision(decided, handed)) {
    return changed(options_.vendor->ToAllocateAnnotation(), handed);
  }
  return absl::OkStatus();
}

absl::Status Scheduler::Recheck(const kube::Pod& pod, std::string_view node,
                                const device::PodDevices& devices, int32_t init_count,
                                const std::vector<device::MigAllocation>& mig) {
  const std::string& uid = pod.meta.uid;
  MutexLock l(&decide_mu_);
  ledger_->Release(uid);
  filter_seq_.erase(uid);
  binding_.erase(uid);
  TESSERA_RETURN_IF_ERROR(ledger_->Reserve(uid, pod.meta.ns, pod.meta.name, node, devices,
                                           clock_->Now() + options_.reservation_ttl, init_count,
                                           mig));
  // From here until the bind fails or the pod is observed bound, expiry leaves it alone.
  binding_[uid] = absl::InfiniteFuture();
  std::vector<std::optional<device::NodeSnapshot>> snap = ledger_->Snapshot({node});
  auto refuse = [&](const std::string& message) {
    ledger_->Release(uid);
    return absl::FailedPreconditionError(message);
  };
  if (!snap[0] || !snap[0]->devices) {
    return refuse(
        fmt::format("node {} is not registered: devices of {} no longer free", node, pod.Key()));
  }
  const device::NodeDevices& nd = *snap[0]->devices;
  for (const device::ContainerDevices& container : devices) {
    for (const device::ContainerDevice& d : container) {
      const int i = nd.Find(d.uuid);
      if (i < 0) {
        return refuse(fmt::format("device {} of {} is no longer registered on node {}", d.uuid,
                                  pod.Key(), node));
      }
      const device::DeviceInfo& info = nd.devices[static_cast<size_t>(i)];
      const device::DeviceUsage& u = snap[0]->usage[static_cast<size_t>(i)];
      // A mig card's instances book their profile's core rounded up (seven 1g instances: 105 %
      // of 100), which the fit allows as HAMi's does; its bound is its placements, checked
      // below, so its cores are not bounded here.
      const bool mig_card = info.mode == "mig";
      if (u.used > info.count || u.usedmem > info.devmem ||
          (!mig_card && u.usedcores > info.devcore)) {
        return refuse(fmt::format(
            "devices of {} no longer free: device {} on node {} would hold {}/{} slots, "
            "{}/{} MiB, {}/{}% cores",
            pod.Key(), d.uuid, node, u.used, info.count, u.usedmem, info.devmem, u.usedcores,
            info.devcore));
      }
      if (!snap[0]->mig.empty()) {
        if (std::string conflict = device::MigCardConflict(snap[0]->mig[static_cast<size_t>(i)]);
            !conflict.empty()) {
          return refuse(fmt::format("devices of {} no longer free: device {} on node {}: {}",
                                    pod.Key(), d.uuid, node, conflict));
        }
      }
    }
  }
  // A placement may name a card none of the devices is on (HAMi's usage rebuild books it there):
  // that card must be free of overlaps too.
  for (const device::MigAllocation& a : mig) {
    const int i = nd.Find(a.gpu_uuid);
    if (i < 0 || snap[0]->mig.empty()) {
      continue;
    }
    if (std::string conflict = device::MigCardConflict(snap[0]->mig[static_cast<size_t>(i)]);
        !conflict.empty()) {
      return refuse(fmt::format("devices of {} no longer free: device {} on node {}: {}", pod.Key(),
                                a.gpu_uuid, node, conflict));
    }
  }
  return absl::OkStatus();
}

// ---- reservations -------------------------------------------------------------------------

std::vector<ledger::Reservation> Scheduler::ExpireReservations(absl::Time now) {
  busy_.Purge(now);
  std::vector<ledger::Reservation> expired;
  {
    MutexLock l(&decide_mu_);
    // Binds whose reservation has ended (the pod was observed bound or gone) or that were
    // never observed within bound_hold are forgotten; the rest keep their reservation.
    for (auto it = binding_.begin(); it != binding_.end();) {
      auto current = it++;
      const bool stale =
          current->second != absl::InfiniteFuture() && current->second + options_.bound_hold <= now;
      if (stale || !ledger_->HasReservation(current->first)) {
        if (stale) {
          TESSERA_LOG(kWarning,
                      "pod uid {} was bound at {} but never observed bound: its reservation "
                      "is no longer kept",
                      current->first, absl::FormatTime(current->second));
        }
        binding_.erase(current);
      }
    }
    absl::flat_hash_set<std::string> keep;
    for (const auto& [uid, since] : binding_) {
      keep.insert(uid);
    }
    expired = ledger_->ExpireReservations(now, [&keep](std::string_view uid) {
      return keep.contains(absl::string_view(uid.data(), uid.size()));
    });
  }
  // Landed patches of pods that were never bound.
  patches_.DropLanded(now - options_.reservation_ttl);
  for (const ledger::Reservation& r : expired) {
    TESSERA_VLOG(1, "reservation of {}/{} on {} expired", r.ns, r.name, r.node);
  }
  return expired;
}

std::vector<ledger::Reservation> Scheduler::ReleaseAbsent(
    absl::Time list_started, const std::function<bool(std::string_view uid)>& present) {
  std::vector<ledger::Reservation> released;
  MutexLock l(&decide_mu_);
  for (const ledger::Reservation& r : ledger_->Reservations()) {
    if (r.expires_at - options_.reservation_ttl >= list_started || present(r.uid)) {
      continue;
    }
    if (ledger_->Release(r.uid)) {
      filter_seq_.erase(r.uid);
      binding_.erase(r.uid);
      released.push_back(r);
    }
  }
  return released;
}

}  // namespace tessera::extender
