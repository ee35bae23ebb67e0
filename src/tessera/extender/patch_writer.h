// File: tessera/extender/patch_writer.h
//
// PatchWriter writes the filter's annotation patch of a pod (hami.io/vgpu-node and the rest, a
// JSON merge patch with metadata.uid and, when the job names one, metadata.resourceVersion as
// preconditions) behind the /filter reply, on a pool of
// writer threads, and hands the result to the pod's Bind. /filter then answers in the time of
// its decision, not of an API round trip: the decision is held by a ledger reservation, and
// nothing reads the annotations before Bind, which first takes the pod's patch here.
//
//   PatchWriter writer({.threads = 4, .wait = absl::Seconds(30)}, client, settle);
//   writer.Submit(job);                        // Filter: queued, returns at once
//   std::optional<PatchWriter::Landed> p = writer.Take(uid);  // Bind: waits for it
//
// Ordering: the patches of one pod never overtake each other. Submit first waits (up to
// `wait`) for the pod's earlier patch, so the last decision is the one left on the pod. Take
// waits up to `wait` for the pod's latest patch and removes it; a patch still in flight then is
// returned with done == false. The patched pod goes to the call that removes the patch (another
// call waiting for the same patch gets its status without the pod).
//
// A 409 to a patch that names a resourceVersion (the pod changed since the filter checked it) is
// answered by a fresh GET: the patch is written again at the new version only while
// `still_applies(current)` is OK (the filter's rule: the pod is still pending), at most three
// writes in all; otherwise the patch fails with the reason it gives (docs/serve.md "Filter and
// bind"). Other errors are not retried. `settle(job, status)` runs on the writer thread once
// the patch is written or has failed, before Take can see the result: the Scheduler uses it to
// undo the reservation of a failed patch. The status of a failure reads "patch pod <ns>/<name>
// annotations: <API error>".
//
// Write() is the synchronous form (no threads needed; settle runs too) for write-behind off.
//
// Thread safety: every method may be called concurrently from any thread; `settle` is called
// without the writer's lock held and may call the writer's client, not the writer. The client
// must outlive the writer. The destructor writes what is queued, then joins the threads
// ("sched-patch").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/base/work_queue.h"
#include "tessera/kube/client.h"
#include "tessera/kube/objects.h"

namespace tessera::extender {

class PatchWriter {
 public:
  struct Options {
    int threads = 4;  // writers for Submit; 0: Submit must not be used (only Write)
    absl::Duration wait = absl::Seconds(30);  // how long Take and Submit wait for a patch
    Clock* clock = nullptr;                   // for `wait` and the timing log; nullptr: real
  };
  // One filter's patch of one pod.
  struct Job {
    std::string ns, name, uid;
    uint64_t seq = 0;  // the caller's sequence number of the decision (for `settle`)
    absl::Time created;
    kube::MetadataPatch patch;
  };
  // A pod's patch as Take finds it.
  struct Landed {
    bool done = false;             // false: still in flight after `wait`
    absl::Status status;           // when done
    std::optional<kube::Pod> pod;  // the patched pod, when done and ok
  };
  using Settle = std::function<void(const Job& job, const absl::Status& status)>;
  // Whether a patch still applies to the pod as the API server now holds it (same uid checked
  // already); nullptr: a 409 fails the patch.
  using StillApplies = std::function<absl::Status(const kube::Pod& current)>;

  PatchWriter(Options options, kube::ApiClient* client, Settle settle,
              StillApplies still_applies = nullptr);
  ~PatchWriter();
  PatchWriter(const PatchWriter&) = delete;
  PatchWriter& operator=(const PatchWriter&) = delete;

  // Queues the pod's patch after its earlier one (see Ordering).
  void Submit(Job job);
  // Writes the patch now and settles it; the patched pod on success.
  absl::StatusOr<kube::Pod> Write(const Job& job);
  // The pod's latest patch, after waiting for it (see Ordering); nullopt when none is kept.
  std::optional<Landed> Take(const std::string& uid);
  // Forgets landed patches created at or before `cutoff` that no Bind took.
  void DropLanded(absl::Time cutoff);

 private:
  // A patch's result, kept as plain values: every Take builds its own Status from them, so no
  // Status representation is shared between the writer and the threads that take it.
  struct Slot {
    bool done = false;
    absl::StatusCode code = absl::StatusCode::kOk;
    std::string message;
    std::optional<kube::Pod> pod;
    absl::Time created;
  };
  struct Queued {
    Job job;
    std::shared_ptr<Slot> slot;
    absl::Time queued;  // when Submit queued it (for the --v 2 timing log)
  };
  void WriteQueued(Queued q);
  absl::StatusOr<kube::Pod> WriteAndSettle(const Job& job);
  absl::StatusOr<kube::Pod> WritePatch(const Job& job);

  const Options options_;
  kube::ApiClient* const client_;
  Clock* const clock_;
  const Settle settle_;
  const StillApplies still_applies_;

  Mutex mu_;
  CondVar done_cv_;  // some slot became done
  // uid → the pod's latest patch (pending, or done and not yet taken).
  absl::flat_hash_map<std::string, std::shared_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  WorkQueue queue_;  // last: its writers stop before the members they use go
};

}  // namespace tessera::extender
