#include "tessera/extender/scheduler.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <memory>
#include <utility>

#include <fmt/core.h>

#include "tessera/base/logging.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/device/mig.h"
#include "tessera/extender/scheduler_internal.h"
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

using internal::Message;
using internal::NotPending;

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
      verdicts_({.clock = clock_}, client_, &events_),
      patches_(
          {.threads = options_.write_behind ? std::max(options_.patch_threads, 1) : 0,
           .wait = options_.patch_wait,
           .clock = clock_},
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
  Verdict verdict = BuildVerdict(diagnosis, {.request = &request,
                                             .candidates = candidates,
                                             .ledger = ledger_,
                                             .lock_of = std::move(lock_of),
                                             .withheld = options_.withheld});
  {
    MutexLock l(&notes_mu_);
    if (auto it = preemption_notes_.find(pod.meta.uid); it != preemption_notes_.end()) {
      verdict.preemption = it->second;
    }
  }
  std::vector<std::string_view> names;
  names.reserve(candidates.size());
  for (const schedule::Candidate& c : candidates) {
    names.push_back(c.name);
  }
  verdicts_.Offer(pod.meta, checked_version, verdict.reason, EncodeVerdict(verdict),
                  VerdictWriter::CandidatesKey(names));
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
    // A share preemption freed goes to its preemptor before anyone else decides.
    if (!nominations_.empty()) {
      SettleNominationsLocked(now, decided->meta.uid);
    }
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
      if (!nominations_.empty()) {
        nominations_.erase(decided->meta.uid);
      }
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
    if (options_.refused) {
      std::vector<std::string> sent;
      sent.reserve(candidates.size());
      for (const schedule::Candidate& c : candidates) {
        sent.push_back(c.name);
      }
      options_.refused(*decided, std::move(sent));
    }
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
  job.patch = ToPatch(device::FilterAnnotations(*options_.vendor, *decided, winner,
                                                decision.devices, now, decision.mig),
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

}  // namespace tessera::extender
