#include "tessera/extender/scheduler.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include <fmt/core.h>
#include <pthread.h>

#include "tessera/accounting/projection.h"
#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"
#include "tessera/device/annotations.h"
#include "tessera/schedule/fit.h"
#include "tessera/schedule/score.h"

namespace tessera::extender {
namespace {

using SteadyClock = std::chrono::steady_clock;

absl::Duration Since(SteadyClock::time_point start) {
  return absl::FromChrono(SteadyClock::now() - start);
}

std::string Rfc3339(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

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

// The reason names of one failed node, for events and stats: the parts' names, or the whole
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

// Cuts `text` to at most `limit` bytes at a UTF-8 character boundary, ending it with "...".
void CapMessage(std::string* text, size_t limit) {
  if (text->size() <= limit) {
    return;
  }
  size_t cut = limit - 3;
  while (cut > 0 && (static_cast<unsigned char>((*text)[cut]) & 0xC0) == 0x80) {
    --cut;  // not in the middle of a multi-byte character
  }
  text->resize(cut);
  *text += "...";
}

// A node list for an event message, "<head>(<item>,<item>,...)", kept within
// Scheduler::kEventMessageLimit bytes: items that do not fit are dropped and counted, and the
// list ends "... <n> more)".
class EventList {
 public:
  EventList(std::string head, std::string_view separator)
      : text_(std::move(head)), separator_(separator) {
    text_ += '(';
    // Room for the tail: "," + "... 4294967295 more" + ")".
    constexpr size_t kTail = 22;
    budget_ = Scheduler::kEventMessageLimit > text_.size() + kTail
                  ? Scheduler::kEventMessageLimit - kTail
                  : text_.size();
    first_ = text_.size();
  }

  // True while items still fit: a caller with costly items may stop building them.
  bool Open() const { return omitted_ == 0; }

  void Add(std::string_view item) {
    const size_t sep = text_.size() > first_ ? separator_.size() : 0;
    if (omitted_ == 0 && text_.size() + sep + item.size() <= budget_) {
      text_.append(separator_.data(), sep);
      text_ += item;
    } else {
      ++omitted_;
    }
  }
  // Counts an item that was not built because the list is already full.
  void Omit() { ++omitted_; }

  std::string Finish() && {
    if (omitted_ > 0) {
      text_ += text_.size() > first_ ? std::string(separator_) : std::string();
      text_ += fmt::format("... {} more", omitted_);
    }
    text_ += ')';
    return std::move(text_);
  }

 private:
  std::string text_;
  std::string_view separator_;
  size_t budget_ = 0;
  size_t first_ = 0;
  size_t omitted_ = 0;
};

}  // namespace

void LatencyStats::Observe(absl::Duration d) {
  const double s = absl::ToDoubleSeconds(d);
  ++count;
  sum_seconds += s;
  max_seconds = std::max(max_seconds, s);
  for (size_t i = 0; i < kBuckets; ++i) {
    if (s <= kBounds[i]) {
      ++buckets[i];
    }
  }
}

Scheduler::Scheduler(Options options, Deps deps)
    : options_(std::move(options)),
      ledger_(deps.ledger),
      client_(deps.client),
      clock_(deps.clock != nullptr ? deps.clock : Clock::Real()),
      lookup_(std::move(deps.lookup)) {
  TESSERA_CHECK(options_.vendor != nullptr);
  TESSERA_CHECK(ledger_ != nullptr);
  TESSERA_CHECK(client_ != nullptr);
  // Named for `top -H` and perf.
  event_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "sched-events");
    EventLoop();
  });
  if (options_.write_behind) {
    for (int i = 0; i < std::max(options_.patch_threads, 1); ++i) {
      patch_threads_.emplace_back([this] {
        pthread_setname_np(pthread_self(), "sched-patch");
        PatchLoop();
      });
    }
  }
}

Scheduler::~Scheduler() {
  {
    MutexLock l(&patch_mu_);
    patch_stopping_ = true;  // the writers finish the queue first
    patch_work_cv_.SignalAll();
  }
  for (std::thread& t : patch_threads_) {
    t.join();
  }
  {
    MutexLock l(&events_mu_);
    stopping_ = true;
    events_cv_.SignalAll();
  }
  event_thread_.join();
}

// ---- filter -------------------------------------------------------------------------------

FilterResult Scheduler::Filter(const FilterArgs& args, std::string* outcome) {
  const SteadyClock::time_point start = SteadyClock::now();
  const kube::Pod& pod = args.pod;
  FilterResult result;
  auto fail = [&](const absl::Status& s) {
    result = FilterResult();
    result.error = Message(s);
    if (!args.nodes || args.node_names) {
      Record(pod, "FilteringFailed", result.error, true);
    }
    CountFilter("error", Since(start), outcome);
    return result;
  };

  absl::StatusOr<device::PodRequest> request = options_.vendor->DecodeRequest(pod);
  if (!request.ok()) {
    return fail(request.status());
  }
  if (request->Empty()) {
    // Untouched: echo the input. A reservation cannot exist for such a pod unless its spec
    // changed; drop it if it does.
    if (!pod.meta.uid.empty() && (!args.nodes || args.node_names)) {
      ledger_->Release(pod.meta.uid);
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
    CountFilter("pass_through", Since(start), outcome);
    return result;
  }
  absl::StatusOr<device::PodConstraints> constraints = options_.vendor->DecodeConstraints(pod);
  if (!constraints.ok()) {
    return fail(constraints.status());
  }
  if (args.nodes && !args.node_names) {
    result = FilterNodes(args, *request, *constraints);
    CountFilter("simulated", Since(start), outcome);
    return result;
  }
  if (pod.meta.uid.empty()) {
    return fail(absl::InvalidArgumentError(
        fmt::format("pod {} has no metadata.uid: cannot reserve for it", pod.Key())));
  }
  if (absl::Status pending = CheckPending(pod); !pending.ok()) {
    return fail(pending);
  }

  const std::vector<std::string> names = CandidateNames(args);
  std::vector<std::string_view> views(names.begin(), names.end());
  const absl::Time now = clock_->Now();
  std::vector<schedule::Candidate> candidates(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    candidates[i].name = names[i];
  }
  schedule::Decision decision;
  uint64_t seq = 0;
  absl::Duration decide_took;
  {
    MutexLock l(&decide_mu_);
    const SteadyClock::time_point decide_start = SteadyClock::now();
    // The pod's earlier decision no longer holds: it must not compete with itself.
    ledger_->Release(pod.meta.uid);
    filter_seq_.erase(pod.meta.uid);
    std::vector<std::optional<device::NodeSnapshot>> snapshots = ledger_->Snapshot(views);
    for (size_t i = 0; i < names.size(); ++i) {
      candidates[i].snapshot = std::move(snapshots[i]);
    }
    decision = schedule::Decide(candidates, *request, *constraints, options_.node_policy,
                                options_.gpu_policy);
    if (decision.winner) {
      absl::Status reserved = ledger_->Reserve(pod.meta.uid, pod.meta.ns, pod.meta.name,
                                               candidates[*decision.winner].name, decision.devices,
                                               now + options_.reservation_ttl,
                                               static_cast<int32_t>(request->init_count));
      if (!reserved.ok()) {
        return fail(reserved);
      }
      seq = ++next_seq_;
      filter_seq_[pod.meta.uid] = seq;
    }
    decide_took = Since(decide_start);
  }

  std::map<std::string, std::vector<std::string>> by_reason;  // reason → nodes (for events)
  size_t not_fit = 0;
  {
    MutexLock l(&stats_mu_);
    stats_.decide_latency.Observe(decide_took);
    for (size_t i = 0; i < decision.nodes.size(); ++i) {
      const schedule::NodeResult& r = decision.nodes[i];
      if (r.fit) {
        continue;
      }
      ++not_fit;
      for (std::string& key : ReasonKeys(r)) {
        ++stats_.filter_node_reasons[std::string(schedule::ReasonLabel(key))];
        by_reason[std::move(key)].push_back(candidates[i].name);
      }
    }
  }

  if (!decision.winner) {
    result.node_names.emplace();
    for (size_t i = 0; i < decision.nodes.size(); ++i) {
      if (!decision.nodes[i].fit) {
        result.failed_nodes[candidates[i].name] = decision.nodes[i].reason;
      }
    }
    for (auto& [reason, nodes] : by_reason) {
      std::sort(nodes.begin(), nodes.end());
      nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
      EventList list(fmt::format("{} nodes {}", nodes.size(), reason), ", ");
      for (const std::string& n : nodes) {
        list.Add(n);
      }
      Record(pod, "FilteringFailed", std::move(list).Finish(), true);
    }
    if (names.empty()) {
      Record(pod, "FilteringFailed", "no candidate nodes", true);
    }
    CountFilter("no_fit", Since(start), outcome);
    return result;
  }

  const std::string& winner = candidates[*decision.winner].name;
  PatchJob job;
  job.ns = pod.meta.ns;
  job.name = pod.meta.name;
  job.uid = pod.meta.uid;
  job.seq = seq;
  job.patch = ToPatch(device::FilterAnnotations(*options_.vendor, winner, decision.devices, now),
                      device::FilterLabels(winner));
  job.patch.uid = pod.meta.uid;  // this pod, never another of the same name
  if (options_.write_behind) {
    // The pod's earlier patch (a re-filter) must land first, so the last decision wins.
    (void)TakePatch(job.uid);
    job.pending = std::make_shared<PendingPatch>();
    job.pending->seq = seq;
    job.pending->created = now;
    {
      MutexLock l(&patch_mu_);
      patches_[job.uid] = job.pending;
      patch_queue_.push_back(std::move(job));
    }
    patch_work_cv_.Signal();  // one writer is enough; after the unlock, which it needs
  } else {
    std::optional<kube::Pod> patched;
    if (absl::Status written = WritePatch(job, &patched); !written.ok()) {
      return fail(written);
    }
  }

  result.node_names = std::vector<std::string>{winner};
  // "<node>:<score with 2 decimals>,..." built with std::to_chars, which rounds exactly as
  // fmt's {:.2f} does: formatting each entry with fmt cost a third of the instructions of a
  // 500-candidate filter (callgrind, docs/benchmarks.md). Entries past the message limit are
  // only counted.
  const size_t fit_count = decision.nodes.size() - not_fit;
  EventList fits(
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
  Record(pod, "FilteringSucceed", std::move(fits).Finish(), false);
  CountFilter("fit", Since(start), outcome);
  return result;
}

FilterResult Scheduler::FilterNodes(const FilterArgs& args, const device::PodRequest& request,
                                    const device::PodConstraints& constraints) {
  const std::vector<WireNode>& nodes = *args.nodes;
  std::vector<std::string_view> views;
  views.reserve(nodes.size());
  for (const WireNode& n : nodes) {
    views.push_back(n.node.meta.name);
  }
  std::vector<std::optional<device::NodeSnapshot>> snapshots = ledger_->Snapshot(views);
  std::vector<schedule::Candidate> candidates(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    candidates[i].name = nodes[i].node.meta.name;
    if (snapshots[i]) {
      candidates[i].snapshot = std::move(snapshots[i]);
      continue;
    }
    // Not in the ledger (e.g. an autoscaler template node): its own registration, unused.
    absl::StatusOr<device::NodeDevices> devices = options_.vendor->DecodeNode(nodes[i].node);
    if (devices.ok()) {
      device::NodeSnapshot snap;
      snap.usage.resize(devices->devices.size());
      snap.devices = std::make_shared<const device::NodeDevices>(*std::move(devices));
      candidates[i].snapshot = std::move(snap);
    }
  }
  schedule::Decision decision =
      schedule::Decide(candidates, request, constraints, options_.node_policy, options_.gpu_policy);
  FilterResult result;
  result.nodes.emplace();
  if (decision.winner) {
    result.nodes->push_back(nodes[*decision.winner].raw);
    return result;
  }
  for (size_t i = 0; i < decision.nodes.size(); ++i) {
    if (!decision.nodes[i].fit) {
      result.failed_nodes[candidates[i].name] = decision.nodes[i].reason;
    }
  }
  return result;
}

absl::Status Scheduler::WritePatch(const PatchJob& job, std::optional<kube::Pod>* patched) {
  const SteadyClock::time_point start = SteadyClock::now();
  absl::StatusOr<kube::Pod> result = client_->PatchPodMetadata(job.ns, job.name, job.patch);
  {
    MutexLock l(&decide_mu_);
    auto it = filter_seq_.find(job.uid);
    const bool ours = it != filter_seq_.end() && it->second == job.seq;
    if (ours) {
      filter_seq_.erase(it);
      if (!result.ok()) {
        ledger_->Release(job.uid);
      }
    }
  }
  {
    MutexLock l(&stats_mu_);
    stats_.patch_latency.Observe(Since(start));
    if (!result.ok()) {
      ++stats_.patch_failures;
    }
  }
  if (!result.ok()) {
    return absl::Status(
        result.status().code(),
        fmt::format("patch pod {}/{} annotations: {}", job.ns, job.name, Message(result.status())));
  }
  *patched = *std::move(result);
  return absl::OkStatus();
}

void Scheduler::PatchLoop() {
  while (true) {
    PatchJob job;
    {
      MutexLock l(&patch_mu_);
      while (patch_queue_.empty() && !patch_stopping_) {
        patch_work_cv_.Wait(&patch_mu_);
      }
      if (patch_queue_.empty()) {
        return;
      }
      job = std::move(patch_queue_.front());
      patch_queue_.pop_front();
    }
    std::optional<kube::Pod> patched;
    absl::Status status = WritePatch(job, &patched);
    if (!status.ok()) {
      TESSERA_LOG(kWarning, "filter of {}/{}: {} (its bind will fail and be retried)", job.ns,
                  job.name, Message(status));
      kube::Pod subject;
      subject.meta.ns = job.ns;
      subject.meta.name = job.name;
      subject.meta.uid = job.uid;
      Record(subject, "FilteringFailed", Message(status), true);
    }
    MutexLock l(&patch_mu_);
    job.pending->status = status;
    job.pending->pod = std::move(patched);
    job.pending->done = true;
    patch_done_cv_.SignalAll();
  }
}

std::optional<std::shared_ptr<Scheduler::PendingPatch>> Scheduler::TakePatch(
    const std::string& uid) {
  MutexLock l(&patch_mu_);
  auto it = patches_.find(uid);
  if (it == patches_.end()) {
    return std::nullopt;
  }
  std::shared_ptr<PendingPatch> pending = it->second;
  const absl::Time deadline = absl::Now() + options_.patch_wait;
  while (!pending->done) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return pending;  // still in flight: the caller reports it
    }
    patch_done_cv_.WaitFor(&patch_mu_,
                           absl::ToChronoMilliseconds(left) + std::chrono::milliseconds(1));
  }
  auto again = patches_.find(uid);
  if (again != patches_.end() && again->second == pending) {
    patches_.erase(again);
  }
  return pending;
}

namespace {

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

}  // namespace

absl::Status Scheduler::CheckPending(const kube::Pod& claimed) {
  TESSERA_RETURN_IF_ERROR(NotPending(claimed));
  std::optional<kube::Pod> current;
  if (lookup_) {
    current = lookup_(claimed.meta.ns, claimed.meta.name);
  }
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
  return NotPending(*current);
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

BindResult Scheduler::Bind(const BindArgs& args, std::string* outcome_out) {
  const SteadyClock::time_point start = SteadyClock::now();
  BindResult result;
  kube::Pod subject;  // the event's involved object until the pod is known
  subject.meta.ns = args.pod_namespace;
  subject.meta.name = args.pod_name;
  subject.meta.uid = args.pod_uid;
  // A failure releases the pod's reservation; a refusal (the request names a pod or node that
  // is not ours to bind, or one another bind is handling) changes nothing.
  auto finish = [&](const kube::Pod& pod, std::string_view outcome, const absl::Status& s,
                    bool release) {
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
    Record(pod, "BindingFailed", result.error, true);
    CountBind(outcome, Since(start));
    if (outcome_out != nullptr) {
      *outcome_out = std::string(outcome);
    }
    TESSERA_VLOG(1, "bind {}/{} to {} failed ({}): {}", args.pod_namespace, args.pod_name,
                 args.node, outcome, result.error);
    return result;
  };
  auto fail = [&](const kube::Pod& pod, std::string_view outcome, const absl::Status& s) {
    return finish(pod, outcome, s, /*release=*/true);
  };
  auto refuse = [&](const kube::Pod& pod, std::string_view outcome, const absl::Status& s) {
    return finish(pod, outcome, s, /*release=*/false);
  };
  if (!kube::IsDnsSubdomain(args.pod_name) || !kube::IsDnsLabel(args.pod_namespace) ||
      !kube::IsDnsSubdomain(args.node)) {
    // The HTTP layer refuses these (DecodeBindArgs); no API path is built from them here either,
    // and no event, which would have no pod to name.
    result.error = fmt::format("bind of pod \"{}/{}\" to node \"{}\": not valid Kubernetes names",
                               absl::CEscape(args.pod_namespace), absl::CEscape(args.pod_name),
                               absl::CEscape(args.node));
    CountBind("error", Since(start));
    if (outcome_out != nullptr) {
      *outcome_out = "error";
    }
    return result;
  }

  const std::string key = args.pod_namespace + "/" + args.pod_name;
  {
    MutexLock l(&decide_mu_);
    if (!binds_in_flight_.insert(key).second) {
      return refuse(
          subject, "in_progress",
          absl::AbortedError(fmt::format(
              "a bind of pod {} is already in progress; this duplicate changes nothing", key)));
    }
  }
  struct InFlight {
    Scheduler* self;
    const std::string& key;
    ~InFlight() {
      MutexLock l(&self->decide_mu_);
      self->binds_in_flight_.erase(key);
    }
  } in_flight{this, key};

  // The filter's patch, written behind its reply: it must have landed, and the pod it
  // returned is the freshest copy there is (no GET needed).
  std::optional<kube::Pod> from_patch;
  if (!args.pod_uid.empty()) {
    if (std::optional<std::shared_ptr<PendingPatch>> pending = TakePatch(args.pod_uid)) {
      if (!(*pending)->done) {
        return fail(
            subject, "error",
            absl::DeadlineExceededError(fmt::format(
                "the filter's annotation patch of {}/{} is still in flight after {}",
                args.pod_namespace, args.pod_name, absl::FormatDuration(options_.patch_wait))));
      }
      if (!(*pending)->status.ok()) {
        return fail(subject, "patch_failed", (*pending)->status);
      }
      from_patch = (*pending)->pod;
    }
  }
  absl::StatusOr<kube::Pod> pod = from_patch ? absl::StatusOr<kube::Pod>(*std::move(from_patch))
                                             : FindPod(args.pod_namespace, args.pod_name);
  if (!pod.ok()) {
    return fail(subject, absl::IsNotFound(pod.status()) ? "pod_not_found" : "error", pod.status());
  }
  // A cached copy may predate the filter's patch or belong to an earlier pod of the same name.
  const bool stale = (!args.pod_uid.empty() && pod->meta.uid != args.pod_uid) ||
                     pod->meta.annotations.Get(device::kVgpuNodeAnnotation) != args.node;
  if (stale && lookup_) {
    absl::StatusOr<kube::Pod> fresh = client_->GetPod(args.pod_namespace, args.pod_name);
    if (!fresh.ok()) {
      return fail(subject, absl::IsNotFound(fresh.status()) ? "pod_not_found" : "error",
                  fresh.status());
    }
    pod = std::move(fresh);
  }
  if (!args.pod_uid.empty() && pod->meta.uid != args.pod_uid) {
    return fail(subject, "pod_not_found",
                absl::NotFoundError(fmt::format("pod {}/{} has uid {}, not {}: it was recreated",
                                                args.pod_namespace, args.pod_name, pod->meta.uid,
                                                args.pod_uid)));
  }
  // Only Tessera's pods, on nodes it knows, are bound here (kube-scheduler binds the rest: the
  // scheduler configuration's managedResources send only pods asking for a managed device).
  if (!options_.scheduler_name.empty() && pod->scheduler_name != options_.scheduler_name) {
    return refuse(
        *pod, "not_ours",
        absl::FailedPreconditionError(fmt::format(
            "pod {} names scheduler \"{}\", not \"{}\": this extender binds only its own pods",
            pod->Key(), pod->scheduler_name, options_.scheduler_name)));
  }
  absl::StatusOr<device::PodRequest> request = options_.vendor->DecodeRequest(*pod);
  if (!request.ok()) {
    return refuse(*pod, "error", request.status());
  }
  if (request->Empty()) {
    return refuse(*pod, "not_ours",
                  absl::FailedPreconditionError(fmt::format(
                      "pod {} asks for no device this scheduler manages: kube-scheduler binds it "
                      "(list the device resources in the extender's managedResources)",
                      pod->Key())));
  }
  if (!pod->node_name.empty()) {
    return refuse(*pod, "binding_rejected",
                  absl::FailedPreconditionError(fmt::format("pod {} is already assigned to node {}",
                                                            pod->Key(), pod->node_name)));
  }
  if (pod->Deleting()) {
    return refuse(*pod, "binding_rejected",
                  absl::FailedPreconditionError(
                      fmt::format("pod {} is being deleted: it cannot be bound", pod->Key())));
  }
  if (std::vector<std::optional<device::NodeSnapshot>> snap = ledger_->Snapshot({args.node});
      !snap[0] || !snap[0]->devices) {
    return refuse(*pod, "node_unregistered",
                  absl::FailedPreconditionError(fmt::format(
                      "node {} is not registered: it has no device registration this scheduler "
                      "can read, so it binds no pod there",
                      args.node)));
  }
  std::string outcome = "bound";
  bool still_held = false;
  if (absl::Status bound = BindManaged(*pod, args, &outcome, &still_held); !bound.ok()) {
    return finish(*pod, outcome, bound, /*release=*/!still_held);
  }
  Record(*pod, "BindingSucceed",
         fmt::format("Successfully binding node [{}] to {}/{}", args.node, pod->meta.ns,
                     pod->meta.name),
         false);
  CountBind("bound", Since(start));
  if (outcome_out != nullptr) {
    *outcome_out = "bound";
  }
  return result;
}

bool Scheduler::StillBound(const kube::Pod& pod) {
  absl::StatusOr<kube::Pod> now = client_->GetPod(pod.meta.ns, pod.meta.name);
  return now.ok() && now->meta.uid == pod.meta.uid && !now->node_name.empty();
}

absl::Status Scheduler::BindManaged(const kube::Pod& pod, const BindArgs& args,
                                    std::string* outcome, bool* still_held) {
  const std::string& node = args.node;
  absl::StatusOr<ledger::PodAllocation> alloc = accounting::ProjectPod(*options_.vendor, pod);
  if (!alloc.ok()) {
    *outcome = "no_allocation";
    return alloc.status();
  }
  if (alloc->node != node) {
    *outcome = "no_allocation";
    return absl::FailedPreconditionError(
        alloc->node.empty()
            ? fmt::format("pod {} carries no {} annotation: it was not filtered by this scheduler",
                          pod.Key(), device::kVgpuNodeAnnotation)
            : fmt::format("pod {} was filtered to node {}, not {}", pod.Key(), alloc->node, node));
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
    *outcome = absl::IsAborted(lock.status()) ? "lock_held" : "lock_error";
    if (absl::IsAborted(lock.status()) && lock_options.wait > absl::ZeroDuration()) {
      MutexLock l(&stats_mu_);
      ++stats_.lock_waits["timed_out"];
    }
    return lock.status();
  }
  {
    MutexLock l(&stats_mu_);
    ++stats_.lock_outcomes[std::string(NodeLockOutcomeName(lock->outcome))];
    stats_.lock_conflicts_retried += static_cast<uint64_t>(lock->conflicts);
    if (lock->refusals > 0) {
      ++stats_.lock_waits["acquired"];
      stats_.lock_wait_latency.Observe(lock->waited);
    }
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
  if (absl::Status free = Recheck(pod, node, alloc->devices, alloc->init_count); !free.ok()) {
    unlock();
    *outcome = "devices_not_free";
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
  if (absl::Status b = client_->BindPod(pod.meta.ns, pod.meta.name, pod.meta.uid, node, phase);
      !b.ok()) {
    unlock();
    *outcome = "binding_rejected";
    if (absl::IsAborted(b) && StillBound(pod)) {
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

absl::Status Scheduler::Recheck(const kube::Pod& pod, std::string_view node,
                                const device::PodDevices& devices, int32_t init_count) {
  const std::string& uid = pod.meta.uid;
  MutexLock l(&decide_mu_);
  ledger_->Release(uid);
  filter_seq_.erase(uid);
  binding_.erase(uid);
  TESSERA_RETURN_IF_ERROR(ledger_->Reserve(uid, pod.meta.ns, pod.meta.name, node, devices,
                                           clock_->Now() + options_.reservation_ttl, init_count));
  // From here until the bind fails or the pod is observed bound, expiry leaves it alone.
  binding_[uid] = absl::InfiniteFuture();
  std::vector<std::optional<device::NodeSnapshot>> snap = ledger_->Snapshot({node});
  auto refuse = [&](std::string message) {
    ledger_->Release(uid);
    return absl::FailedPreconditionError(std::move(message));
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
      if (u.used > info.count || u.usedmem > info.devmem || u.usedcores > info.devcore) {
        return refuse(fmt::format(
            "devices of {} no longer free: device {} on node {} would hold {}/{} slots, "
            "{}/{} MiB, {}/{}% cores",
            pod.Key(), d.uuid, node, u.used, info.count, u.usedmem, info.devmem, u.usedcores,
            info.devcore));
      }
    }
  }
  return absl::OkStatus();
}

// ---- reservations and stats ---------------------------------------------------------------

std::vector<ledger::Reservation> Scheduler::ExpireReservations(absl::Time now) {
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
  {
    // Landed patches of pods that were never bound.
    MutexLock l(&patch_mu_);
    for (auto it = patches_.begin(); it != patches_.end();) {
      auto current = it++;
      if (current->second->done && current->second->created + options_.reservation_ttl <= now) {
        patches_.erase(current);
      }
    }
  }
  if (!expired.empty()) {
    MutexLock l(&stats_mu_);
    stats_.reservations_expired += expired.size();
  }
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

Stats Scheduler::stats() const {
  const size_t in_flight = ledger_->Reservations().size();
  MutexLock l(&stats_mu_);
  Stats s = stats_;
  s.reservations_in_flight = in_flight;
  return s;
}

void Scheduler::CountFilter(std::string_view outcome, absl::Duration took,
                            std::string* outcome_out) {
  if (outcome_out != nullptr) {
    *outcome_out = std::string(outcome);
  }
  MutexLock l(&stats_mu_);
  ++stats_.filter_outcomes[std::string(outcome)];
  stats_.filter_latency.Observe(took);
}

void Scheduler::CountBind(std::string_view outcome, absl::Duration took) {
  MutexLock l(&stats_mu_);
  ++stats_.bind_outcomes[std::string(outcome)];
  stats_.bind_latency.Observe(took);
}

// ---- events -------------------------------------------------------------------------------

void Scheduler::Record(const kube::Pod& pod, std::string reason, std::string message,
                       bool warning) {
  Event e;
  e.pod.meta.ns = pod.meta.ns;
  e.pod.meta.name = pod.meta.name;
  e.pod.meta.uid = pod.meta.uid;
  e.reason = std::move(reason);
  e.message = std::move(message);
  CapMessage(&e.message, kEventMessageLimit);
  e.warning = warning;
  {
    MutexLock l(&events_mu_);
    if (events_.size() >= options_.event_queue_limit) {
      MutexLock s(&stats_mu_);
      ++stats_.events_dropped;
      return;
    }
    events_.push_back(std::move(e));
  }
  // After the unlock: the sender woken under the lock would block on it at once.
  events_cv_.SignalAll();
}

void Scheduler::FlushEvents() {
  MutexLock l(&events_mu_);
  while (!events_.empty() || events_busy_) {
    events_cv_.Wait(&events_mu_);
  }
}

void Scheduler::EventLoop() {
  for (;;) {
    Event e;
    kube::CoreEvent ce;
    {
      MutexLock l(&events_mu_);
      while (events_.empty() && !stopping_) {
        events_cv_.Wait(&events_mu_);
      }
      if (events_.empty()) {
        return;  // stopping, drained
      }
      e = std::move(events_.front());
      events_.pop_front();
      events_busy_ = true;
      const absl::Time now = clock_->Now();
      // Unique names even when the clock does not move (a fake clock, a coarse one).
      const int64_t nanos = std::max(absl::ToUnixNanos(now), last_event_nanos_ + 1);
      last_event_nanos_ = nanos;
      ce.name = kube::EventName(e.pod.meta.name, absl::FromUnixNanos(nanos));
      ce.first_timestamp = Rfc3339(now);
      ce.last_timestamp = ce.first_timestamp;
    }
    ce.ns = e.pod.meta.ns;
    ce.involved_kind = "Pod";
    ce.involved_api_version = "v1";
    ce.involved_ns = e.pod.meta.ns;
    ce.involved_name = e.pod.meta.name;
    ce.involved_uid = e.pod.meta.uid;
    ce.reason = e.reason;
    ce.message = e.message;
    ce.type = e.warning ? "Warning" : "Normal";
    ce.source_component = options_.scheduler_name;
    absl::Status sent = client_->CreateEvent(ce);
    if (!sent.ok()) {
      TESSERA_LOG(kWarning, "event {} for pod {}/{} not recorded: {}", ce.reason, ce.involved_ns,
                  ce.involved_name, Message(sent));
    }
    {
      MutexLock s(&stats_mu_);
      ++(sent.ok() ? stats_.events_sent : stats_.events_failed);
    }
    MutexLock l(&events_mu_);
    events_busy_ = false;
    events_cv_.SignalAll();
  }
}

}  // namespace tessera::extender
