#include "tessera/serve/debug_auth.h"

#include <utility>

#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <openssl/sha.h>

namespace tessera::serve {
namespace {

using extender::DebugAccess;
using extender::DebugCaller;

// A string member of `obj`, "" when absent or not a string.
std::string StringOf(const nlohmann::json& obj, const char* key) {
  if (!obj.is_object()) {
    return "";
  }
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

// The strings of an array (other elements skipped).
std::vector<std::string> StringsOf(const nlohmann::json& array) {
  std::vector<std::string> out;
  if (array.is_array()) {
    for (const nlohmann::json& v : array) {
      if (v.is_string()) {
        out.push_back(v.get<std::string>());
      }
    }
  }
  return out;
}

// A member that is `true`.
bool TrueOf(const nlohmann::json& obj, const char* key) {
  if (!obj.is_object()) {
    return false;
  }
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() && it->get<bool>();
}

// Text from the API server or a caller, fit for one line of a reply (printable ASCII, at most
// 200 characters).
std::string OneLine(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 200)) {
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return out;
}

std::string Dump(const nlohmann::json& doc) {
  return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Whether `token` can be a bearer token (visible ASCII, bounded): anything else is refused
// without asking the API server.
bool PlausibleToken(std::string_view token) {
  if (token.empty() || token.size() > DebugGate::kMaxTokenBytes) {
    return false;
  }
  for (char c : token) {
    if (c <= 0x20 || c >= 0x7f) {
      return false;
    }
  }
  return true;
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  std::string out;
  out.reserve(size_t{2} * SHA256_DIGEST_LENGTH);
  for (unsigned char b : digest) {
    out += fmt::format("{:02x}", b);
  }
  return out;
}

class KubeDebugReviewer : public DebugReviewer {
 public:
  KubeDebugReviewer(kube::Transport* transport, absl::Duration timeout)
      : transport_(transport), timeout_(timeout) {}

  absl::StatusOr<DebugUser> Authenticate(std::string_view token) override {
    absl::StatusOr<kube::Response> r =
        Post("/apis/authentication.k8s.io/v1/tokenreviews", TokenReviewBody(token));
    if (!r.ok()) {
      return r.status();
    }
    return DecodeTokenReview(r->body);
  }

  absl::StatusOr<bool> Authorize(const DebugUser& user, std::string_view path,
                                 std::string_view verb, std::string* reason) override {
    absl::StatusOr<kube::Response> r = Post("/apis/authorization.k8s.io/v1/subjectaccessreviews",
                                            AccessReviewBody(user, path, verb));
    if (!r.ok()) {
      return r.status();
    }
    return DecodeAccessReview(r->body, reason);
  }

 private:
  absl::StatusOr<kube::Response> Post(std::string path, std::string body) {
    kube::Request request;
    request.method = "POST";
    request.path = std::move(path);
    request.body = std::move(body);
    request.content_type = "application/json";
    request.timeout = timeout_;
    kube::DoOptions once;
    once.retry.max_attempts = 1;
    return kube::Do(*transport_, request, std::move(once));
  }

  kube::Transport* const transport_;
  const absl::Duration timeout_;
};

}  // namespace

absl::StatusOr<DebugAuthMode> ParseDebugAuthMode(std::string_view text) {
  if (text == "loopback") {
    return DebugAuthMode::kLoopback;
  }
  if (text == "kubernetes") {
    return DebugAuthMode::kKubernetes;
  }
  return absl::InvalidArgumentError(fmt::format(
      "--debug-auth={}: want loopback (only loopback peers read /debug) or kubernetes (also "
      "callers whose bearer token the API server authenticates and authorises)",
      OneLine(text)));
}

std::string TokenReviewBody(std::string_view token) {
  return Dump({{"apiVersion", "authentication.k8s.io/v1"},
               {"kind", "TokenReview"},
               {"spec", {{"token", std::string(token)}}}});
}

std::string AccessReviewBody(const DebugUser& user, std::string_view path, std::string_view verb) {
  nlohmann::json spec = {
      {"user", user.name},
      {"nonResourceAttributes", {{"path", std::string(path)}, {"verb", std::string(verb)}}}};
  if (!user.uid.empty()) {
    spec["uid"] = user.uid;
  }
  if (!user.groups.empty()) {
    spec["groups"] = user.groups;
  }
  if (!user.extra.empty()) {
    spec["extra"] = user.extra;
  }
  return Dump({{"apiVersion", "authorization.k8s.io/v1"},
               {"kind", "SubjectAccessReview"},
               {"spec", std::move(spec)}});
}

absl::StatusOr<DebugUser> DecodeTokenReview(std::string_view body) {
  const nlohmann::json doc = nlohmann::json::parse(body, nullptr, false);
  if (!doc.is_object()) {
    return absl::DataLossError("the TokenReview answer is not a JSON object");
  }
  const nlohmann::json status = doc.value("status", nlohmann::json::object());
  if (!TrueOf(status, "authenticated")) {
    const std::string error = StringOf(status, "error");
    return absl::UnauthenticatedError(error.empty() ? "the token is not valid" : OneLine(error));
  }
  const nlohmann::json user =
      status.is_object() ? status.value("user", nlohmann::json::object()) : nlohmann::json();
  DebugUser out;
  out.name = StringOf(user, "username");
  out.uid = StringOf(user, "uid");
  if (user.is_object()) {
    out.groups = StringsOf(user.value("groups", nlohmann::json::array()));
    const nlohmann::json extra = user.value("extra", nlohmann::json::object());
    if (extra.is_object()) {
      for (const auto& [key, values] : extra.items()) {
        out.extra[key] = StringsOf(values);
      }
    }
  }
  if (out.name.empty()) {
    return absl::UnauthenticatedError("the TokenReview names no user");
  }
  return out;
}

absl::StatusOr<bool> DecodeAccessReview(std::string_view body, std::string* reason) {
  const nlohmann::json doc = nlohmann::json::parse(body, nullptr, false);
  if (!doc.is_object()) {
    return absl::DataLossError("the SubjectAccessReview answer is not a JSON object");
  }
  const nlohmann::json status = doc.value("status", nlohmann::json::object());
  if (reason != nullptr) {
    *reason = OneLine(StringOf(status, "reason"));
  }
  return TrueOf(status, "allowed") && !TrueOf(status, "denied");
}

std::unique_ptr<DebugReviewer> NewKubeDebugReviewer(kube::Transport* transport,
                                                    absl::Duration timeout) {
  return std::make_unique<KubeDebugReviewer>(transport, timeout);
}

DebugGate::DebugGate(DebugAuthMode mode, DebugReviewer* reviewer, Clock* clock)
    : mode_(mode), reviewer_(reviewer), clock_(clock) {}

int64_t DebugGate::reviews() const {
  MutexLock l(&mu_);
  return reviews_;
}

DebugAccess DebugGate::Check(const DebugCaller& caller) {
  // A loopback peer is inside the pod's network namespace: kubectl port-forward, or the pod.
  if (caller.loopback || mode_ == DebugAuthMode::kLoopback || reviewer_ == nullptr) {
    return extender::LoopbackOnlyDebugAccess(caller);
  }
  if (caller.token.empty()) {
    return {401, "Unauthorized: /debug needs a bearer token (Authorization: Bearer TOKEN)"};
  }
  if (!PlausibleToken(caller.token)) {
    return {401, "Unauthorized: the bearer token is malformed"};
  }
  return Review(caller.token, caller.path, caller.verb);
}

DebugAccess DebugGate::Review(std::string_view token, std::string_view path,
                              std::string_view verb) {
  std::string key = Sha256Hex(token);
  key += ' ';
  key += verb;
  key += ' ';
  key += path;
  {
    MutexLock l(&mu_);
    const absl::Time now = clock_->Now();
    if (auto it = cache_.find(key); it != cache_.end()) {
      if (it->second.expires > now) {
        return it->second.access;
      }
      cache_.erase(it);
    }
    if (in_flight_ >= kMaxReviewsInFlight) {
      return {429, "Too Many Requests: too many token reviews in flight; retry"};
    }
    ++in_flight_;
    ++reviews_;
  }
  DebugAccess access;
  bool cacheable = true;
  absl::StatusOr<DebugUser> user = reviewer_->Authenticate(token);
  if (!user.ok()) {
    if (user.status().code() == absl::StatusCode::kUnauthenticated) {
      access = {401, fmt::format("Unauthorized: {}", std::string(user.status().message()))};
    } else {
      access = {503, fmt::format("cannot review the token with the API server: {}",
                                 OneLine(std::string(user.status().message())))};
      cacheable = false;
    }
  } else {
    std::string reason;
    absl::StatusOr<bool> allowed = reviewer_->Authorize(*user, path, verb, &reason);
    if (!allowed.ok()) {
      access = {503, fmt::format("cannot review the access with the API server: {}",
                                 OneLine(std::string(allowed.status().message())))};
      cacheable = false;
    } else if (!*allowed) {
      access = {403, fmt::format("forbidden: user \"{}\" may not {} {}{}", OneLine(user->name),
                                 verb, path, reason.empty() ? "" : ": " + reason)};
    }
  }
  MutexLock l(&mu_);
  --in_flight_;
  if (cacheable) {
    const absl::Time now = clock_->Now();
    if (cache_.size() >= kMaxCacheEntries) {
      absl::erase_if(cache_, [now](const auto& kv) { return kv.second.expires <= now; });
    }
    if (cache_.size() >= kMaxCacheEntries) {
      cache_.clear();
    }
    cache_[key] = Entry{now + kCacheTtl, access};
  }
  return access;
}

}  // namespace tessera::serve
