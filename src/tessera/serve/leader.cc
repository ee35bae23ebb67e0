#include "tessera/serve/leader.h"

#include <array>
#include <random>
#include <utility>

#include <unistd.h>

#include <fmt/core.h>

#include "tessera/base/logging.h"

namespace tessera::serve {
namespace {

// MicroTime: RFC 3339, UTC, exactly six fractional digits (docs/k8s-protocol.md §5).
std::string FormatMicroTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone());
}

std::optional<absl::Time> ParseMicroTime(const std::optional<std::string>& text) {
  if (!text || text->empty()) {
    return std::nullopt;
  }
  absl::Time t;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, *text, &t, &error)) {
    return std::nullopt;
  }
  return t;
}

bool SameSpec(const kube::Lease& a, const kube::Lease& b) {
  return a.holder_identity == b.holder_identity &&
         a.lease_duration_seconds == b.lease_duration_seconds && a.acquire_time == b.acquire_time &&
         a.renew_time == b.renew_time && a.lease_transitions == b.lease_transitions;
}

int32_t WholeSeconds(absl::Duration d) {
  const int64_t s = absl::ToInt64Seconds(absl::Ceil(d, absl::Seconds(1)));
  return static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(s, INT32_MAX)));
}

std::string Seconds(absl::Duration d) { return fmt::format("{:.1f}s", absl::ToDoubleSeconds(d)); }

}  // namespace

std::string_view LeaderModeName(LeaderMode mode) {
  switch (mode) {
    case LeaderMode::kNone:
      return "none";
    case LeaderMode::kFollow:
      return "follow";
    case LeaderMode::kLease:
      return "lease";
  }
  return "?";
}

absl::StatusOr<LeaderMode> ParseLeaderMode(std::string_view text) {
  for (LeaderMode m : {LeaderMode::kNone, LeaderMode::kFollow, LeaderMode::kLease}) {
    if (text == LeaderModeName(m)) {
      return m;
    }
  }
  return absl::InvalidArgumentError(
      fmt::format("want follow, lease or none, got \"{}\"", std::string(text)));
}

std::string Elector::HostName() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0) {
    return "localhost";
  }
  return std::string(buf.data());
}

std::string Elector::UniqueIdentity(std::string_view host) {
  std::random_device rd;
  std::array<uint8_t, 16> b{};
  for (size_t i = 0; i < b.size(); i += 4) {
    const uint32_t r = rd();
    for (size_t j = 0; j < 4; ++j) {
      b[i + j] = static_cast<uint8_t>(r >> (8 * j));
    }
  }
  b[6] = static_cast<uint8_t>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<uint8_t>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  std::string hex;
  for (size_t i = 0; i < b.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) {
      hex += '-';
    }
    hex += fmt::format("{:02x}", b[i]);
  }
  return fmt::format("{}_{}", host, hex);
}

absl::StatusOr<std::unique_ptr<Elector>> Elector::Create(kube::ApiClient* client,
                                                         ElectorOptions options) {
  if (options.mode != LeaderMode::kNone && client == nullptr) {
    return absl::InvalidArgumentError("leader election needs an API client");
  }
  if (absl::Status s = Validate(options); !s.ok()) {
    return s;
  }
  if (options.clock == nullptr) {
    options.clock = Clock::Real();
  }
  return std::unique_ptr<Elector>(new Elector(client, std::move(options)));
}

absl::Status Elector::Validate(const ElectorOptions& options) {
  if (options.mode != LeaderMode::kNone) {
    if (options.ns.empty() || options.name.empty()) {
      return absl::InvalidArgumentError(
          "--leader-elect-resource-namespace and --leader-elect-resource-name must not be empty");
    }
    if (options.lease_duration <= absl::ZeroDuration() ||
        options.renew_deadline <= absl::ZeroDuration() ||
        options.retry_period <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          "--leader-elect-lease-duration, --leader-elect-renew-deadline and "
          "--leader-elect-retry-period must be positive");
    }
  }
  if (options.mode == LeaderMode::kLease) {
    if (options.lease_duration <= options.renew_deadline) {
      return absl::InvalidArgumentError(
          "--leader-elect-lease-duration must be greater than --leader-elect-renew-deadline");
    }
    if (options.renew_deadline <= options.retry_period * 1.2) {
      return absl::InvalidArgumentError(
          "--leader-elect-renew-deadline must be greater than 1.2 × --leader-elect-retry-period");
    }
  }
  return absl::OkStatus();
}

Elector::Elector(kube::ApiClient* client, ElectorOptions options)
    : client_(client), options_(std::move(options)) {
  const std::string host = options_.identity.empty() ? HostName() : options_.identity;
  identity_ = options_.mode == LeaderMode::kLease ? UniqueIdentity(host) : host;
}

Elector::~Elector() { Stop(); }

bool Elector::HolderIsMe(std::string_view holder) const {
  if (options_.mode == LeaderMode::kLease) {
    return holder == identity_;
  }
  return holder == identity_ ||
         (holder.size() > identity_.size() && holder.substr(0, identity_.size()) == identity_ &&
          holder[identity_.size()] == '_');
}

bool Elector::LeaderLocked(absl::Time now) const {
  if (stopped_) {
    return false;
  }
  switch (options_.mode) {
    case LeaderMode::kNone:
      return true;
    case LeaderMode::kFollow: {
      if (!have_read_) {
        return false;
      }
      if (!lease_found_ || !lease_) {
        return true;  // no election to follow (file comment)
      }
      if (!HolderIsMe(lease_->holder_identity.value_or(""))) {
        return false;
      }
      std::optional<absl::Time> at = ParseMicroTime(lease_->renew_time);
      if (!at) {
        at = ParseMicroTime(lease_->acquire_time);
      }
      if (!at) {
        return false;
      }
      const absl::Duration duration = lease_->lease_duration_seconds
                                          ? absl::Seconds(*lease_->lease_duration_seconds)
                                          : options_.lease_duration;
      return now < *at + duration;
    }
    case LeaderMode::kLease:
      return holding_ && now < renewed_at_ + options_.renew_deadline;
  }
  return false;
}

bool Elector::IsLeader() const {
  const absl::Time now = options_.clock->Now();
  MutexLock lock(&mu_);
  return LeaderLocked(now);
}

uint64_t Elector::generation() const {
  MutexLock lock(&mu_);
  return generation_;
}

void Elector::NoteError(const absl::Status& status) {
  std::string message(status.message());
  {
    MutexLock lock(&mu_);
    ++errors_;
    last_error_ = message;
    if (message == logged_error_) {
      return;  // a persisting error (RBAC, a wrong namespace) is logged once, not every round
    }
    logged_error_ = message;
  }
  TESSERA_LOG(kWarning, "leader: Lease {}/{}: {}", options_.ns, options_.name, message);
}

void Elector::Step() {
  {
    MutexLock lock(&mu_);
    if (stopped_) {
      return;
    }
    ++rounds_;
    last_error_.clear();
  }
  const absl::Time now = options_.clock->Now();
  if (options_.mode == LeaderMode::kFollow) {
    StepFollow(now);
  } else if (options_.mode == LeaderMode::kLease) {
    StepLease(now);
  }
  Publish();
}

void Elector::StepFollow(absl::Time /*now*/) {
  absl::StatusOr<kube::Lease> got = client_->GetLease(options_.ns, options_.name);
  if (!got.ok() && !absl::IsNotFound(got.status())) {
    NoteError(got.status());
    return;  // keep what was last seen; it expires by the clock
  }
  MutexLock lock(&mu_);
  logged_error_.clear();
  have_read_ = true;
  lease_found_ = got.ok();
  if (got.ok()) {
    lease_ = *std::move(got);
  } else {
    lease_.reset();
  }
}

void Elector::StepLease(absl::Time now) {
  const bool ok = TryAcquireOrRenew(now);
  MutexLock lock(&mu_);
  if (ok) {
    logged_error_.clear();
    if (!holding_) {
      TESSERA_LOG(kInfo, "leader: acquired Lease {}/{} as {}", options_.ns, options_.name,
                  identity_);
    }
    holding_ = true;
    renewed_at_ = now;
  } else if (holding_ && now >= renewed_at_ + options_.renew_deadline) {
    TESSERA_LOG(kWarning, "leader: no renewal of Lease {}/{} for {}: leadership lost ({})",
                options_.ns, options_.name, Seconds(now - renewed_at_), last_error_);
    holding_ = false;
  }
}

bool Elector::TryAcquireOrRenew(absl::Time now) {
  const int32_t duration_s = WholeSeconds(options_.lease_duration);
  // Fast path: renew the Lease we hold with the resourceVersion we wrote.
  std::optional<kube::Lease> cached;
  {
    MutexLock lock(&mu_);
    if (holding_ && lease_ && observed_at_ + options_.lease_duration > now) {
      cached = lease_;
    }
  }
  if (cached) {
    kube::Lease up = *cached;
    up.holder_identity = identity_;
    up.lease_duration_seconds = duration_s;
    up.renew_time = FormatMicroTime(now);
    absl::StatusOr<kube::Lease> written = client_->UpdateLease(up);
    if (written.ok()) {
      MutexLock lock(&mu_);
      lease_ = *std::move(written);
      lease_found_ = true;
      observed_at_ = now;
      return true;
    }
    NoteError(written.status());  // then the slow path, as client-go does
  }

  absl::StatusOr<kube::Lease> got = client_->GetLease(options_.ns, options_.name);
  if (absl::IsNotFound(got.status())) {
    kube::Lease fresh;
    fresh.meta.ns = options_.ns;
    fresh.meta.name = options_.name;
    fresh.holder_identity = identity_;
    fresh.lease_duration_seconds = duration_s;
    fresh.acquire_time = FormatMicroTime(now);
    fresh.renew_time = fresh.acquire_time;
    fresh.lease_transitions = 0;
    absl::StatusOr<kube::Lease> created = client_->CreateLease(fresh);
    if (!created.ok()) {
      NoteError(created.status());
      return false;
    }
    MutexLock lock(&mu_);
    lease_ = *std::move(created);
    lease_found_ = true;
    have_read_ = true;
    observed_at_ = now;
    return true;
  }
  if (!got.ok()) {
    NoteError(got.status());
    return false;
  }

  const std::string holder = got->holder_identity.value_or("");
  {
    MutexLock lock(&mu_);
    have_read_ = true;
    lease_found_ = true;
    if (!lease_ || !SameSpec(*lease_, *got)) {
      observed_at_ = now;  // a change seen now: the holder's claim runs from here
    }
    lease_ = *got;
    const absl::Duration claim = got->lease_duration_seconds
                                     ? absl::Seconds(*got->lease_duration_seconds)
                                     : options_.lease_duration;
    if (!holder.empty() && holder != identity_ && observed_at_ + claim > now) {
      if (holding_) {
        TESSERA_LOG(kWarning, "leader: Lease {}/{} is now held by {}: leadership lost", options_.ns,
                    options_.name, holder);
        holding_ = false;
      }
      return false;
    }
  }

  kube::Lease up = *got;
  up.holder_identity = identity_;
  up.lease_duration_seconds = duration_s;
  up.renew_time = FormatMicroTime(now);
  if (holder == identity_) {
    if (!up.acquire_time) {
      up.acquire_time = up.renew_time;
    }
  } else {
    up.acquire_time = up.renew_time;
    up.lease_transitions = got->lease_transitions.value_or(0) + 1;
  }
  absl::StatusOr<kube::Lease> written = client_->UpdateLease(up);
  if (!written.ok()) {
    NoteError(written.status());  // a 409: someone else wrote first; next round decides
    return false;
  }
  MutexLock lock(&mu_);
  lease_ = *std::move(written);
  observed_at_ = now;
  return true;
}

void Elector::Publish() {
  const absl::Time now = options_.clock->Now();
  bool leader = false;
  {
    MutexLock lock(&mu_);
    leader = LeaderLocked(now);
    if (leader == reported_) {
      return;
    }
    reported_ = leader;
    ++generation_;
  }
  TESSERA_LOG(kInfo, "leader: this replica is now the {}: {}", leader ? "leader" : "follower",
              Describe());
  if (options_.on_change) {
    options_.on_change(leader);
  }
}

void Elector::Start() {
  if (thread_.joinable()) {
    return;
  }
  thread_ = std::thread([this] {
    std::mt19937_64 rng(std::random_device{}());
    std::uniform_real_distribution<double> jitter(0.0, 1.2);
    while (true) {
      Step();
      absl::Duration wait = options_.retry_period;
      if (options_.mode == LeaderMode::kLease && !IsLeader()) {
        wait += options_.retry_period * jitter(rng);  // client-go's JitterUntil(…, 1.2)
      }
      MutexLock lock(&run_mu_);
      if (!run_stop_) {
        run_cv_.WaitFor(&run_mu_, absl::ToChronoNanoseconds(wait));
      }
      if (run_stop_) {
        return;
      }
    }
  });
}

void Elector::Stop() {
  {
    MutexLock lock(&run_mu_);
    run_stop_ = true;
    run_cv_.SignalAll();
  }
  if (thread_.joinable()) {
    thread_.join();
  }
  {
    MutexLock lock(&mu_);
    if (stopped_) {
      return;
    }
  }
  if (options_.mode == LeaderMode::kLease) {
    Release();
  }
  {
    MutexLock lock(&mu_);
    stopped_ = true;
  }
  Publish();
}

void Elector::Release() {
  std::optional<kube::Lease> held;
  const absl::Time now = options_.clock->Now();
  {
    MutexLock lock(&mu_);
    if (!holding_ || !lease_ || lease_->holder_identity.value_or("") != identity_) {
      return;
    }
    held = lease_;
    holding_ = false;  // no writer may act on leadership from here on
  }
  kube::Lease up = *held;
  up.holder_identity = "";
  up.lease_duration_seconds = 1;
  up.acquire_time = FormatMicroTime(now);
  up.renew_time = up.acquire_time;
  absl::StatusOr<kube::Lease> written = client_->UpdateLease(up);
  if (!written.ok()) {
    TESSERA_LOG(kWarning, "leader: releasing Lease {}/{}: {}", options_.ns, options_.name,
                std::string(written.status().message()));
    NoteError(written.status());
    return;
  }
  TESSERA_LOG(kInfo, "leader: released Lease {}/{}", options_.ns, options_.name);
  MutexLock lock(&mu_);
  lease_ = *std::move(written);
}

ElectorStatus Elector::status() const {
  const absl::Time now = options_.clock->Now();
  MutexLock lock(&mu_);
  ElectorStatus s;
  s.mode = options_.mode;
  s.leader = LeaderLocked(now);
  s.identity = identity_;
  if (options_.mode != LeaderMode::kNone) {
    s.lease = options_.ns + "/" + options_.name;
  }
  s.lease_read = have_read_;
  s.lease_found = lease_found_;
  if (lease_) {
    s.holder = lease_->holder_identity.value_or("");
    if (options_.mode == LeaderMode::kLease) {
      if (holding_) {
        s.expires = renewed_at_ + options_.renew_deadline;
      } else if (!s.holder.empty()) {
        s.expires = observed_at_ + (lease_->lease_duration_seconds
                                        ? absl::Seconds(*lease_->lease_duration_seconds)
                                        : options_.lease_duration);
      }
    } else {
      std::optional<absl::Time> at = ParseMicroTime(lease_->renew_time);
      if (!at) {
        at = ParseMicroTime(lease_->acquire_time);
      }
      if (at) {
        s.expires =
            *at + (lease_->lease_duration_seconds ? absl::Seconds(*lease_->lease_duration_seconds)
                                                  : options_.lease_duration);
      }
    }
  }
  s.stopped = stopped_;
  s.generation = generation_;
  s.rounds = rounds_;
  s.errors = errors_;
  s.last_error = last_error_;
  return s;
}

std::string Elector::Describe() const {
  const ElectorStatus s = status();
  const absl::Time now = options_.clock->Now();
  const char* role = s.leader ? "leader" : "follower";
  std::string expiry;
  if (s.expires) {
    expiry = *s.expires > now ? fmt::format(", expires in {}", Seconds(*s.expires - now))
                              : fmt::format(", expired {} ago", Seconds(now - *s.expires));
  }
  if (s.stopped) {
    return fmt::format("{} (stopped)", role);
  }
  std::string error = s.last_error.empty() ? "" : fmt::format("; last error: {}", s.last_error);
  switch (s.mode) {
    case LeaderMode::kNone:
      return fmt::format("{} (leader election off: this replica always leads)", role);
    case LeaderMode::kFollow:
      if (!s.lease_read) {
        return fmt::format("{} (follows the kube-scheduler Lease {}: not read yet{})", role,
                           s.lease, error);
      }
      if (!s.lease_found) {
        return fmt::format(
            "{} (follows the kube-scheduler Lease {}: not found, so there is no election to "
            "follow{})",
            role, s.lease, error);
      }
      return fmt::format(
          "{} (follows the kube-scheduler Lease {}: held by \"{}\"{}; this host: {}{})", role,
          s.lease, s.holder, expiry, s.identity, error);
    case LeaderMode::kLease:
      if (s.leader) {
        return fmt::format("{} (holds Lease {} as {}{}{})", role, s.lease, s.identity,
                           s.expires ? fmt::format(", steps down in {} without a renewal",
                                                   Seconds(*s.expires - now))
                                     : "",
                           error);
      }
      return fmt::format("{} (Lease {} held by \"{}\"{}; this replica: {}{})", role, s.lease,
                         s.holder, expiry, s.identity, error);
  }
  return role;
}

}  // namespace tessera::serve
