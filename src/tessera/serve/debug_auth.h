// File: tessera/serve/debug_auth.h
//
// Who may read serve's /debug routes (the ledger lists every pod holding a GPU): the modes of
// --debug-auth and the check behind HttpServerOptions::debug_access. `loopback` (the default)
// serves /debug only to loopback peers (kubectl port-forward, the pod's own containers);
// `kubernetes` also serves a remote caller whose bearer token the API server authenticates
// (TokenReview, authentication.k8s.io/v1) and whose user it authorises to `get` the path as a
// non-resource URL (SubjectAccessReview, authorization.k8s.io/v1), as kube components' delegated
// authentication and authorization do. Design and RBAC: docs/serve.md "Who reads /debug".
//
//   std::unique_ptr<DebugReviewer> reviewer = NewKubeDebugReviewer(transport);
//   DebugGate gate(DebugAuthMode::kKubernetes, reviewer.get(), Clock::Real());
//   options.debug_access = [&gate](const extender::DebugCaller& c) { return gate.Check(c); };
//
// Answers: 0 (serve it); 401 without a token, with one the API server does not authenticate, or
// one that cannot be a bearer token; 403 when the user is not allowed (and in loopback mode for
// every remote caller); 503 when the API server cannot be asked (not cached); 429 while too many
// reviews are in flight. Answers of the API server are cached for 10 s by SHA-256 of the token
// and the path, as kube's delegating authenticator and authorizer cache theirs.
//
// Thread safety: DebugGate::Check and the reviewers are called concurrently from the server's
// workers; both are thread-safe.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/extender/http_server.h"
#include "tessera/kube/transport.h"

namespace tessera::serve {

enum class DebugAuthMode {
  kLoopback,    // only loopback peers
  kKubernetes,  // loopback peers, and remote callers the API server authenticates and allows
};

// "loopback" or "kubernetes"; InvalidArgument naming both otherwise.
absl::StatusOr<DebugAuthMode> ParseDebugAuthMode(std::string_view text);

// A user as TokenReview's status.user gives it.
struct DebugUser {
  std::string name;
  std::string uid;
  std::vector<std::string> groups;
  std::map<std::string, std::vector<std::string>> extra;
};

// The API server's two reviews. Thread-safe.
class DebugReviewer {
 public:
  virtual ~DebugReviewer() = default;
  // The user of `token`; Unauthenticated (with the API server's reason, if any) when the token
  // is not accepted; another error when the API server cannot be asked.
  virtual absl::StatusOr<DebugUser> Authenticate(std::string_view token) = 0;
  // Whether `user` may `verb` the non-resource URL `path`; *reason gets the authorizer's reason.
  // An error when the API server cannot be asked.
  virtual absl::StatusOr<bool> Authorize(const DebugUser& user, std::string_view path,
                                         std::string_view verb, std::string* reason) = 0;
};

// The reviews as POSTs of a TokenReview and a SubjectAccessReview over `transport` (the
// service's client, with its account's credentials: RBAC create tokenreviews and
// subjectaccessreviews), each within `timeout`, not retried. `transport` must outlive it.
std::unique_ptr<DebugReviewer> NewKubeDebugReviewer(kube::Transport* transport,
                                                    absl::Duration timeout = absl::Seconds(10));

// The request bodies and the decoders of the answers, for tests and the fuzz target. The
// decoders take the API server's reply (untrusted bytes: never throw) and return the user
// (Unauthenticated when status.authenticated is not true) or whether status.allowed is true.
std::string TokenReviewBody(std::string_view token);
std::string AccessReviewBody(const DebugUser& user, std::string_view path, std::string_view verb);
absl::StatusOr<DebugUser> DecodeTokenReview(std::string_view body);
absl::StatusOr<bool> DecodeAccessReview(std::string_view body, std::string* reason);

class DebugGate {
 public:
  // How long an answer of the API server is reused (kube's delegating defaults).
  static constexpr absl::Duration kCacheTtl = absl::Seconds(10);
  static constexpr size_t kMaxCacheEntries = 4096;
  static constexpr int kMaxReviewsInFlight = 8;
  static constexpr size_t kMaxTokenBytes = 16 << 10;

  // `reviewer` (may be null in loopback mode) and `clock` must outlive the gate.
  DebugGate(DebugAuthMode mode, DebugReviewer* reviewer, Clock* clock);

  extender::DebugAccess Check(const extender::DebugCaller& caller);

  // Reviews sent to the API server so far (tokens and accesses), for tests and metrics.
  int64_t reviews() const;

 private:
  struct Entry {
    absl::Time expires;
    extender::DebugAccess access;
  };
  extender::DebugAccess Review(std::string_view token, std::string_view path,
                               std::string_view verb);

  const DebugAuthMode mode_;
  DebugReviewer* const reviewer_;
  Clock* const clock_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, Entry> cache_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reviews_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera::serve
