// File: tessera/serve/role_labels.h
//
// RoleLabeler: HAMi HEAD's scheduler-role pod labels (docs/hami-protocol.md §1.7). While this
// replica leads, it sets `hami.io/scheduler-role` to `leader` on its own pod ($POD_NAME) and to
// `follower` on the other pods labelled `app.kubernetes.io/component=hami-scheduler` in its
// namespace, patching only pods whose label differs; followers write nothing. When a pass runs
// (each gain of leadership, every `period`, on a change the informer shows, after failures):
// docs/serve.md "The role labels".
//
//   RoleLabeler labeler(&client, o);   // o.pod_name, o.ns
//   labeler.Tick(clock->Now(), elector->IsLeader(), elector->generation());  // every second
//
// Errors are logged (each distinct message once until a pass succeeds) and counted in stats();
// they never stop the caller. Without POD_NAME, or with `enabled` false, Tick does nothing.
//
// Thread safety: Tick and Pass from one thread at a time (the housekeeping loop); stats() and
// enabled() from any thread. The ApiClient must outlive the labeler.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "absl/time/time.h"

#include "tessera/base/backoff.h"
#include "tessera/base/mutex.h"
#include "tessera/kube/client.h"
#include "tessera/kube/objects.h"

namespace tessera::serve {

// The label HAMi writes, and its two values.
inline constexpr std::string_view kSchedulerRoleLabel = "hami.io/scheduler-role";
inline constexpr std::string_view kRoleLeader = "leader";
inline constexpr std::string_view kRoleFollower = "follower";
// The selector of HAMi's scheduler pods (its chart's component label).
inline constexpr std::string_view kSchedulerPodSelector =
    "app.kubernetes.io/component=hami-scheduler";

struct RoleLabelOptions {
  // --scheduler-role-labels; false: Tick does nothing.
  bool enabled = true;
  // This replica's pod ($POD_NAME); empty: Tick does nothing.
  std::string pod_name;
  // The namespace of the scheduler pods ($POD_NAMESPACE). Must not be empty when pod_name is
  // set (the service fills in the client configuration's namespace).
  std::string ns;
  std::string selector = std::string(kSchedulerPodSelector);
  absl::Duration period = absl::Minutes(1);
  absl::Duration min_interval = absl::Seconds(5);
  // The pod informer's copy of pod `ns/name`, if it has one. Optional: without it only gains,
  // the period and retries start a pass.
  std::function<std::optional<kube::Pod>(std::string_view name)> observed;
  // Re-checked before each PATCH; optional (default: always).
  std::function<bool()> is_leader;
};

// Counters and the last outcome, for /debug/ledger and tests.
struct RoleLabelStats {
  uint64_t passes = 0;     // LISTs made
  uint64_t patches = 0;    // labels written
  uint64_t unchanged = 0;  // pods found already right (summed over passes)
  uint64_t failures = 0;   // failed LISTs and PATCHes (404s not included)
  uint64_t consecutive_failed_passes = 0;
  std::optional<absl::Time> last_pass;
  std::string last_error;  // empty when the last pass succeeded
  // The roles of the last successful pass: pod name -> "leader" / "follower".
  std::map<std::string, std::string> roles;
};

class RoleLabeler {
 public:
  RoleLabeler(kube::ApiClient* client, RoleLabelOptions options);
  RoleLabeler(const RoleLabeler&) = delete;
  RoleLabeler& operator=(const RoleLabeler&) = delete;

  // Whether the labels are written at all (enabled and a pod name).
  bool enabled() const { return options_.enabled && !options_.pod_name.empty(); }
  // Runs a pass if one is due (see the file comment). `leader` and `generation` are the
  // elector's IsLeader() and generation().
  void Tick(absl::Time now, bool leader, uint64_t generation);
  // One pass now, whatever the schedule: LIST, then PATCH the pods whose label differs.
  // Returns true when every call succeeded (404 on a PATCH counts as success).
  bool Pass(absl::Time now);

  RoleLabelStats stats() const;

 private:
  // Whether the informer shows a known pod with another role than the one last written.
  bool ObservedDiffers() const;
  void Warn(const std::string& message);

  kube::ApiClient* const client_;
  const RoleLabelOptions options_;

  // Tick/Pass thread only.
  bool was_leader_ = false;
  uint64_t generation_ = 0;
  absl::Time next_pass_ = absl::InfinitePast();  // a pass is due from then (when leading)
  absl::Time last_pass_ = absl::InfinitePast();
  struct Known {
    std::string want;        // the role written or found
    std::string listed_rv;   // the resourceVersion the LIST returned
    std::string current_rv;  // after our PATCH (== listed_rv when none was needed)
  };
  std::map<std::string, Known> known_;
  std::set<std::string> logged_;  // warnings logged since the last successful pass
  Backoff retry_;                 // after failed passes: min_interval, doubling up to period
  bool missing_self_logged_ = false;

  mutable Mutex mu_;
  RoleLabelStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::serve
