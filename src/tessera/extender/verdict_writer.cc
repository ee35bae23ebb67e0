#include "tessera/extender/verdict_writer.h"

#include <string>
#include <utility>
#include <vector>

#include "tessera/base/logging.h"
#include "tessera/device/annotations.h"

namespace tessera::extender {

VerdictWriter::VerdictWriter(Options options, kube::ApiClient* client, EventRecorder* events)
    : options_(options),
      client_(client),
      events_(events),
      queue_({.name = "sched-verdict", .threads = 1, .on_stop = WorkQueue::OnStop::kDiscard}) {
  TESSERA_CHECK(client_ != nullptr && events_ != nullptr);
}

VerdictWriter::~VerdictWriter() { queue_.Stop(); }  // drops what is queued

uint64_t VerdictWriter::CandidatesKey(const std::vector<std::string_view>& names) {
  uint64_t key = names.size();
  for (std::string_view name : names) {
    key += std::hash<std::string_view>{}(name)*0x9e3779b97f4a7c15ULL;  // order-free: a sum
  }
  return key;
}

bool VerdictWriter::ShouldWrite(const Entry& last, uint64_t hash, std::string_view reason,
                                uint64_t candidates, absl::Time now) const {
  if (last.hash == hash) {
    return false;
  }
  return last.candidates == candidates || last.reason != reason ||
         now - last.written >= options_.refresh;
}

bool VerdictWriter::Offer(const kube::ObjectMeta& pod, std::string_view resource_version,
                          std::string_view reason, std::string json, uint64_t candidates) {
  const uint64_t hash = std::hash<std::string_view>{}(json);
  const absl::Time now = options_.clock->Now();
  {
    MutexLock l(&mu_);
    ++counts_.offered;
    const uint64_t offer = ++offers_;
    auto it = pods_.find(pod.uid);
    if (it != pods_.end() && !ShouldWrite(it->second, hash, reason, candidates, now)) {
      ++counts_.unchanged;
      it->second.offer = offer;
      return false;
    }
    if (it == pods_.end()) {
      if (pods_.size() >= options_.max_pods && !pods_.empty()) {
        const std::string evicted = pods_.begin()->first;
        jobs_.erase(evicted);  // its queued WriteJob finds nothing
        pods_.erase(pods_.begin());
      }
      it = pods_.emplace(pod.uid, Entry{}).first;
    }
    it->second = Entry{.ns = pod.ns,
                       .name = pod.name,
                       .reason = std::string(reason),
                       .hash = hash,
                       .candidates = candidates,
                       .written = now,
                       .offer = offer};
    auto [job, added] = jobs_.try_emplace(pod.uid);
    job->second = Job{.ns = pod.ns,
                      .name = pod.name,
                      .uid = pod.uid,
                      .resource_version = std::string(resource_version),
                      .json = json,
                      .hash = hash};
    if (added) {
      // Under the lock, so that the uids' writes keep the order of their first offers.
      (void)queue_.Push([this, uid = pod.uid] { WriteJob(uid); });
    }
  }
  events_->Record(pod, "FilteringFailed", std::move(json), EventType::kWarning);
  return true;
}

bool VerdictWriter::Forget(std::string_view uid) {
  MutexLock l(&mu_);
  const std::string key(uid);
  jobs_.erase(key);
  return pods_.erase(key) > 0;
}

void VerdictWriter::Retain(const std::function<bool(std::string_view uid)>& pending) {
  MutexLock l(&mu_);
  for (auto it = pods_.begin(); it != pods_.end();) {
    if (pending(it->first)) {
      ++it;
      continue;
    }
    jobs_.erase(it->first);
    pods_.erase(it++);
  }
}

void VerdictWriter::Clear() {
  MutexLock l(&mu_);
  pods_.clear();
  jobs_.clear();
}

std::map<std::string, int64_t> VerdictWriter::CountByReason() const {
  std::map<std::string, int64_t> out;
  MutexLock l(&mu_);
  for (const auto& [uid, e] : pods_) {
    ++out[e.reason];
  }
  return out;
}

std::vector<std::pair<std::string, uint64_t>> VerdictWriter::UidsAndOffers(uint64_t* latest) const {
  std::vector<std::pair<std::string, uint64_t>> out;
  MutexLock l(&mu_);
  out.reserve(pods_.size());
  for (const auto& [uid, e] : pods_) {
    out.emplace_back(uid, e.offer);
  }
  *latest = offers_;
  return out;
}

size_t VerdictWriter::size() const {
  MutexLock l(&mu_);
  return pods_.size();
}

VerdictWriter::Counts VerdictWriter::counts() const {
  MutexLock l(&mu_);
  return counts_;
}

void VerdictWriter::Flush() { queue_.Flush(); }

absl::StatusOr<kube::Pod> VerdictWriter::WriteOnce(const Job& job, kube::MetadataPatch* patch) {
  absl::StatusOr<kube::Pod> patched = client_->PatchPodMetadata(job.ns, job.name, *patch);
  if (patched.ok() || !absl::IsAborted(patched.status()) || !patch->resource_version) {
    return patched;
  }
  // The pod changed since the filter read it (kube-scheduler records the failed attempt in its
  // status right after the filter): write once more at its new version while it is pending and
  // this verdict is still its latest.
  absl::StatusOr<kube::Pod> current = client_->GetPod(job.ns, job.name);
  if (!current.ok()) {
    return current.status();
  }
  if (current->meta.uid != job.uid || !current->node_name.empty() || current->Deleting() ||
      current->Terminal()) {
    return absl::FailedPreconditionError("the pod is no longer pending");
  }
  {
    MutexLock l(&mu_);
    auto it = pods_.find(job.uid);
    if (it == pods_.end() || it->second.hash != job.hash || jobs_.contains(job.uid)) {
      return absl::FailedPreconditionError("a newer verdict replaced this one");
    }
  }
  patch->resource_version = current->meta.resource_version;
  return client_->PatchPodMetadata(job.ns, job.name, *patch);
}

void VerdictWriter::WriteJob(const std::string& uid) {
  Job job;
  {
    MutexLock l(&mu_);
    auto node = jobs_.extract(uid);
    if (node.empty()) {
      return;  // forgotten, evicted, or written by an earlier WriteJob of the uid
    }
    job = std::move(node.mapped());
  }
  kube::MetadataPatch patch;
  patch.annotations.emplace_back(std::string(device::kVerdictAnnotation), job.json);
  patch.uid = job.uid;
  if (!job.resource_version.empty()) {
    patch.resource_version = job.resource_version;
  }
  absl::StatusOr<kube::Pod> patched = WriteOnce(job, &patch);
  MutexLock l(&mu_);
  if (patched.ok()) {
    ++counts_.written;
  } else {
    ++counts_.failed;
    TESSERA_VLOG(2, "verdict of pod {}/{} not written: {}", job.ns, job.name,
                 std::string(patched.status().message()));
    // Written again by the pod's next filter, unless a newer verdict is on its way already.
    if (auto it = pods_.find(job.uid);
        it != pods_.end() && it->second.hash == job.hash && !jobs_.contains(job.uid)) {
      pods_.erase(it);
    }
  }
}

}  // namespace tessera::extender
