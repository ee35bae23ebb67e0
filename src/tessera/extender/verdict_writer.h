// File: tessera/extender/verdict_writer.h
//
// VerdictWriter puts a pending pod's verdict (verdict.h) on the pod — the annotation
// device::kVerdictAnnotation, patched from a background thread, and a FilteringFailed event with
// the same text — only when it differs from the last one written for that pod, so a pod that
// kube-scheduler retries every second costs no API write while nothing changes. Every write
// requeues the pod in kube-scheduler, so a verdict that differs only in the candidates it was
// decided over waits (Options::refresh): otherwise it could be rewritten at every retry. It also
// keeps each pending pod's main reason for tessera_pending_pods{reason}.
//
//   VerdictWriter writer({}, client, &events);
//   writer.Offer(pod.meta, checked_version, verdict.reason, EncodeVerdict(verdict));
//   writer.Forget(uid);        // the pod got a node: its entry and any queued write go
//   writer.Retain(pending);    // housekeeping: drop pods no longer pending
//   writer.CountByReason();    // the gauge
//
// Memory is bounded: at most max_pods pods are remembered (a new pod beyond them evicts an
// arbitrary one, which costs at most a repeated write) and only a 64-bit hash of each text is
// kept; the queue holds at most one write per pod (a newer verdict replaces a queued one).
//
// Why not the filter's PatchWriter: its slot per pod is what Bind takes the decision from, and a
// verdict must never stand in for a decision; the verdict's write may also be dropped freely.
// The patch names the pod's uid and the resourceVersion the filter checked; after a 409 the pod
// is read again and the verdict written at its new version only while the pod is pending and the
// verdict is still its latest (a filter that found a node calls Forget). A failed write forgets
// the entry, so the next filter of the pod writes again.
//
// Thread safety: every method may be called from any thread. The client and the recorder must
// outlive the writer. The destructor drops what is queued and joins the thread
// ("sched-verdict").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/base/work_queue.h"
#include "tessera/extender/event_recorder.h"
#include "tessera/kube/client.h"
#include "tessera/kube/objects.h"

namespace tessera::extender {

class VerdictWriter {
 public:
  struct Options {
    size_t max_pods = 10000;
    // A verdict that differs from the last one written for the pod, offered with other
    // candidates and the same main reason, is written only once the last write is this old
    // (kube-scheduler's own retry of an unschedulable pod: every write requeues the pod).
    absl::Duration refresh = absl::Minutes(5);
    Clock* clock = Clock::Real();
  };
  // Totals since construction.
  struct Counts {
    uint64_t offered = 0;
    uint64_t written = 0;    // patches that landed
    uint64_t failed = 0;     // patches refused or failed
    uint64_t unchanged = 0;  // offers equal to the last verdict written
  };

  VerdictWriter(Options options, kube::ApiClient* client, EventRecorder* events);
  ~VerdictWriter();
  VerdictWriter(const VerdictWriter&) = delete;
  VerdictWriter& operator=(const VerdictWriter&) = delete;

  // The pod's verdict `json` with its main `reason`, decided over the candidates `candidates`
  // identifies (CandidatesKey): queued (patch and event) unless ShouldWrite says otherwise.
  // `resource_version` (may be empty) is the patch's precondition. Returns whether it was
  // queued.
  bool Offer(const kube::ObjectMeta& pod, std::string_view resource_version,
             std::string_view reason, std::string json, uint64_t candidates = 0);
  // The same value for the same node names in any order.
  static uint64_t CandidatesKey(const std::vector<std::string_view>& names);
  // Forgets the pod and cancels its queued write. Returns whether a verdict was known (written
  // or queued): its annotation may be on the pod.
  bool Forget(std::string_view uid);
  // Keeps only the pods for which pending(uid) holds. `pending` runs under the writer's lock and
  // must not call it.
  void Retain(const std::function<bool(std::string_view uid)>& pending);
  // Forgets every pod (a replica that stops leading).
  void Clear();
  // Remembered pods per main reason.
  std::map<std::string, int64_t> CountByReason() const;
  // The uids of the remembered pods (those refused and still pending: the retry's candidates),
  // each with the number of its latest Offer (Offers count from 1 across all pods, whether
  // written or not); `*latest` is set to the latest number given to any pod.
  std::vector<std::pair<std::string, uint64_t>> UidsAndOffers(uint64_t* latest) const;
  size_t size() const;
  Counts counts() const;
  // Blocks until the queue is empty and no write is in flight (tests).
  void Flush();

 private:
  struct Entry {
    std::string ns, name, reason;
    uint64_t hash = 0;
    uint64_t candidates = 0;
    absl::Time written = absl::InfinitePast();
    uint64_t offer = 0;  // the number of its latest Offer
  };
  // The rule: a verdict other than the last one written (`hash`) is written when it was
  // decided over the same candidates (the state behind it changed), has another main reason,
  // or the last write is Options::refresh old; one that differs only because kube-scheduler
  // sent other candidates (a subset, its nominated node alone) waits.
  bool ShouldWrite(const Entry& last, uint64_t hash, std::string_view reason, uint64_t candidates,
                   absl::Time now) const;
  struct Job {
    std::string ns, name, uid, resource_version, json;
    uint64_t hash = 0;
  };
  // Writes the pod's queued verdict, if it still has one.
  void WriteJob(const std::string& uid);
  // The patch; after a 409 (the pod changed) once more at the pod's new version while it is
  // pending and the job is its latest verdict.
  absl::StatusOr<kube::Pod> WriteOnce(const Job& job, kube::MetadataPatch* patch);

  const Options options_;
  kube::ApiClient* const client_;
  EventRecorder* const events_;

  mutable Mutex mu_;
  absl::flat_hash_map<std::string, Entry> pods_ ABSL_GUARDED_BY(mu_);
  // uid → its queued write. queue_ holds a WriteJob(uid) per uid added here; one finding no
  // job (forgotten, evicted, or taken by an earlier WriteJob of the uid) does nothing.
  absl::flat_hash_map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  Counts counts_ ABSL_GUARDED_BY(mu_);
  uint64_t offers_ ABSL_GUARDED_BY(mu_) = 0;
  WorkQueue queue_;  // last: its writer stops before the members it uses go
};

}  // namespace tessera::extender
