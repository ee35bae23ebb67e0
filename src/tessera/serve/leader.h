// File: tessera/serve/leader.h
//
// Elector: which replica of `tessera serve` runs the background writers (the node registry's
// handshake writes, the role labels). Modes: kFollow (default: follow the co-located
// kube-scheduler's Lease, as HAMi v2.8+ does), kLease (hold a Lease of our own with client-go's
// algorithm), kNone (always the leader). The rules of each: docs/serve.md "The elector" and
// "Leadership".
//
//   absl::StatusOr<std::unique_ptr<Elector>> e = Elector::Create(&client, o);
//   (*e)->Start();  if ((*e)->IsLeader()) writer.WriteAll(patches);  (*e)->Stop();
//
// Errors: Create rejects bad options; API errors in a round keep the last Lease seen, so
// leadership still ends when it expires by the clock. Step() runs one round synchronously.
//
// Thread safety: IsLeader, generation, Describe and status from any thread; Step not concurrently
// with itself or with the thread Start runs; Start and Stop from one thread. The ApiClient must
// outlive the elector.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/kube/client.h"
#include "tessera/kube/lease.h"

namespace tessera::serve {

enum class LeaderMode { kNone, kFollow, kLease };
// "none", "follow", "lease".
std::string_view LeaderModeName(LeaderMode mode);
// Inverse of LeaderModeName; InvalidArgument otherwise.
absl::StatusOr<LeaderMode> ParseLeaderMode(std::string_view text);

struct ElectorOptions {
  LeaderMode mode = LeaderMode::kFollow;
  // The Lease (--leader-elect-resource-namespace, --leader-elect-resource-name).
  std::string ns = "kube-system";
  std::string name = "hami-scheduler";
  // This replica's name (--leader-elect-identity): kFollow matches the holder against it;
  // kLease holds the Lease as `<identity>_<uuid>`. Empty: the host name.
  std::string identity;
  // client-go's LeaseDuration / RenewDeadline / RetryPeriod. kFollow uses lease_duration only
  // for a Lease without leaseDurationSeconds and polls every retry_period.
  absl::Duration lease_duration = absl::Seconds(15);
  absl::Duration renew_deadline = absl::Seconds(10);
  absl::Duration retry_period = absl::Seconds(2);
  Clock* clock = Clock::Real();
  // Runs after each change of role (see the file comment).
  std::function<void(bool leader)> on_change;
};

// What the elector last saw, for /readyz, /debug and tests.
struct ElectorStatus {
  LeaderMode mode = LeaderMode::kFollow;
  bool leader = false;
  std::string identity;      // kFollow: the host name matched; kLease: the full holder identity
  std::string lease;         // "ns/name"; empty for kNone
  bool lease_read = false;   // a read of the Lease has succeeded (or found it missing)
  bool lease_found = false;  // ... and it existed
  std::string holder;        // holderIdentity last read (empty: none or released)
  std::optional<absl::Time> expires;  // when the holder's claim ends by our clock
  bool stopped = false;               // Stop() has run
  uint64_t generation = 0;
  uint64_t rounds = 0;
  uint64_t errors = 0;     // API calls that failed (409 races included)
  std::string last_error;  // empty after a round without error
};

class Elector {
 public:
  // InvalidArgument when: ns or name is empty (except kNone), a duration is not positive, or,
  // for kLease, lease_duration <= renew_deadline or renew_deadline <= 1.2 × retry_period
  // (client-go's checks). `client` may be null for kNone only.
  static absl::StatusOr<std::unique_ptr<Elector>> Create(kube::ApiClient* client,
                                                         ElectorOptions options);
  // The checks of Create that do not need the client.
  static absl::Status Validate(const ElectorOptions& options);
  ~Elector();
  Elector(const Elector&) = delete;
  Elector& operator=(const Elector&) = delete;

  // One round: kFollow reads the Lease; kLease tries to acquire or renew it. Blocking.
  void Step();
  // Runs Step at once and then every retry_period (real time) on a thread.
  void Start();
  // Joins the thread; in kLease mode releases the Lease when this replica holds it. The
  // replica is not the leader afterwards. Idempotent.
  void Stop();

  // Evaluated against the clock at the call (a renewal overdue by renew_deadline, or a followed
  // Lease past its expiry, is already "not leader" before the next round notices).
  bool IsLeader() const;
  uint64_t generation() const;
  ElectorStatus status() const;
  // One line: "leader (lease kube-system/x held by h_1, expires in 9.8s)", "follower (...)".
  std::string Describe() const;

  // The host name as the kernel reports it (HAMi's os.Hostname()).
  static std::string HostName();
  // `<host>_<random uuid v4>`, the identity kube-scheduler would use.
  static std::string UniqueIdentity(std::string_view host);

 private:
  Elector(kube::ApiClient* client, ElectorOptions options);

  void StepFollow(absl::Time now);
  void StepLease(absl::Time now);
  bool TryAcquireOrRenew(absl::Time now);
  void Release();
  // Recomputes the role (under mu_) and reports a change.
  void Publish();
  bool LeaderLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteError(const absl::Status& status);
  bool HolderIsMe(std::string_view holder) const;

  kube::ApiClient* const client_;
  const ElectorOptions options_;
  std::string identity_;  // fixed after construction

  mutable Mutex mu_;
  // kFollow / kLease: the Lease last read or written.
  std::optional<kube::Lease> lease_ ABSL_GUARDED_BY(mu_);
  bool lease_found_ ABSL_GUARDED_BY(mu_) = false;
  bool have_read_ ABSL_GUARDED_BY(mu_) = false;  // a first read has completed
  // kLease: when lease_'s spec was first seen in its present form (client-go observedTime).
  absl::Time observed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // kLease: the last successful acquire or renew while holding; InfinitePast when not held.
  absl::Time renewed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool holding_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool reported_ ABSL_GUARDED_BY(mu_) = false;  // the role last published
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rounds_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t errors_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::string logged_error_ ABSL_GUARDED_BY(mu_);  // the last error logged as a warning

  Mutex run_mu_;
  CondVar run_cv_;
  bool run_stop_ ABSL_GUARDED_BY(run_mu_) = false;
  std::thread thread_;
};

}  // namespace tessera::serve
