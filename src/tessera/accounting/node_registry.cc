#include "tessera/accounting/node_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include <fmt/format.h>

#include "tessera/base/logging.h"
#include "tessera/device/annotations.h"
#include "tessera/device/quantity.h"

namespace tessera::accounting {
namespace {

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string_view Trim(std::string_view s) {
  const absl::string_view t = absl::StripAsciiWhitespace(Absl(s));
  return std::string_view(t.data(), t.size());
}

bool IsAlnum(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)); }

// A label name or a non-empty label value: ≤ 63 of [A-Za-z0-9_.-], alphanumeric at both ends.
bool ValidName(std::string_view s) {
  if (s.empty() || s.size() > 63 || !IsAlnum(s.front()) || !IsAlnum(s.back())) {
    return false;
  }
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return IsAlnum(c) || c == '-' || c == '_' || c == '.'; });
}

// A DNS-1123 subdomain: ≤ 253, dot-separated labels of [a-z0-9-], alphanumeric at both ends.
bool ValidSubdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) {
    return false;
  }
  for (absl::string_view label : absl::StrSplit(Absl(s), '.')) {
    if (label.empty() || label.size() > 63) {
      return false;
    }
    for (char c : label) {
      if (!(absl::ascii_islower(static_cast<unsigned char>(c)) ||
            absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '-')) {
        return false;
      }
    }
    if (label.front() == '-' || label.back() == '-') {
      return false;
    }
  }
  return true;
}

bool ValidKey(std::string_view key) {
  const size_t slash = key.find('/');
  if (slash == std::string_view::npos) {
    return ValidName(key);
  }
  return ValidSubdomain(key.substr(0, slash)) && ValidName(key.substr(slash + 1));
}

bool SameDevices(const device::NodeDevices& a, const device::NodeDevices& b) {
  return a.node == b.node && a.format == b.format && a.devices == b.devices &&
         a.cordoned == b.cordoned && a.pair_scores == b.pair_scores;
}

std::string UtcText(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", t, absl::UTCTimeZone());
}

}  // namespace

// ---- NodeSelector -----------------------------------------------------------------------------

absl::StatusOr<NodeSelector> NodeSelector::Parse(std::string_view flag) {
  NodeSelector out;
  if (Trim(flag).empty()) {
    return out;
  }
  for (absl::string_view pair : absl::StrSplit(Absl(flag), ',')) {
    const std::string_view trimmed = Trim(std::string_view(pair.data(), pair.size()));
    if (trimmed.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("--node-label-selector \"{}\": empty entry", std::string(flag)));
    }
    const size_t eq = trimmed.find('=');
    if (eq == std::string_view::npos) {
      return absl::InvalidArgumentError(fmt::format(
          "--node-label-selector: \"{}\" must be formatted as key=value", std::string(trimmed)));
    }
    const std::string_view key = Trim(trimmed.substr(0, eq));
    const std::string_view value = Trim(trimmed.substr(eq + 1));
    if (!ValidKey(key)) {
      return absl::InvalidArgumentError(
          fmt::format("--node-label-selector: \"{}\": \"{}\" is not a valid label key",
                      std::string(trimmed), std::string(key)));
    }
    if (!value.empty() && !ValidName(value)) {
      return absl::InvalidArgumentError(
          fmt::format("--node-label-selector: \"{}\": \"{}\" is not a valid label value",
                      std::string(trimmed), std::string(value)));
    }
    for (const auto& [k, v] : out.requirements_) {
      if (k == key) {
        return absl::InvalidArgumentError(fmt::format(
            "--node-label-selector: key \"{}\" given more than once", std::string(key)));
      }
    }
    out.requirements_.emplace_back(std::string(key), std::string(value));
  }
  std::sort(out.requirements_.begin(), out.requirements_.end());
  return out;
}

bool NodeSelector::Matches(const kube::StringMap& labels) const {
  for (const auto& [key, value] : requirements_) {
    const std::string* have = labels.Find(key);
    if (have == nullptr || *have != value) {
      return false;
    }
  }
  return true;
}

std::string NodeSelector::ToString() const {
  std::string out;
  for (const auto& [key, value] : requirements_) {
    if (!out.empty()) {
      out += ',';
    }
    out += key;
    out += '=';
    out += value;
  }
  return out;
}

std::string_view NodeFormatName(NodeFormat format) {
  switch (format) {
    case NodeFormat::kNone:
      return "none";
    case NodeFormat::kDelimited:
      return "delimited";
    case NodeFormat::kJson:
      return "json";
  }
  return "none";
}

std::string_view AvailabilityName(Availability availability) {
  switch (availability) {
    case Availability::kAvailable:
      return "available";
    case Availability::kNotSelected:
      return "not-selected";
    case Availability::kNoRegistration:
      return "no-registration";
    case Availability::kHandshakeTimeout:
      return "handshake-timeout";
    case Availability::kHandshakeDeleted:
      return "handshake-deleted";
    case Availability::kNotReady:
      return "not-ready";
    case Availability::kNoAllocatable:
      return "no-allocatable";
  }
  return "no-registration";
}

// ---- NodeRegistry -----------------------------------------------------------------------------

struct NodeRegistry::NodeState {
  std::string name;
  std::string resource_version;
  bool selected = false;
  bool has_register = false;  // the register annotation is present on the current object
  kube::ConditionStatus ready = kube::ConditionStatus::kUnknown;
  bool allocatable = false;  // allocatable resource_count_name > 0
  std::string allocatable_text;
  std::vector<std::string> cordoned;

  // The last successful registration (devices and format; node name set).
  std::shared_ptr<const device::NodeDevices> registered;
  std::string register_value;  // the text it decoded from
  // The hami.io/node-nvidia-score text it decoded with (nullopt: the annotation was absent).
  std::optional<std::string> score_value;
  std::string decode_error;
  std::string bad_value;  // the last undecodable text (logged once per distinct value)
  std::optional<std::string> bad_score;  // the score text that went with bad_value
  uint64_t decode_errors = 0;

  // Handshake (delimited).
  bool handshake_seen = false;
  std::string handshake;
  device::Handshake parsed;
  absl::Time since;
  std::optional<absl::Time> deadline;
  std::optional<absl::Time> last_report;
  std::string patch_rv;  // resourceVersion of the last patch asked for
  absl::Time patch_at = absl::InfinitePast();
  device::HandshakeKind patch_kind = device::HandshakeKind::kAbsent;

  Availability availability = Availability::kNoRegistration;
  std::string detail;
  std::shared_ptr<const device::NodeDevices> in_ledger;
  std::string ledger_error;
};

NodeRegistry::NodeRegistry(const device::Vendor* vendor, ledger::Ledger* ledger, Options options)
    : vendor_(vendor), ledger_(ledger), options_(std::move(options)) {}

NodeRegistry::~NodeRegistry() = default;

kube::EventHandlers<kube::Node> NodeRegistry::Handlers(Sinks sinks) {
  auto shared = std::make_shared<Sinks>(std::move(sinks));
  auto observe = [this, shared](const kube::Node& node) {
    std::vector<NodePatch> patches = Observe(node, shared->clock->Now());
    if (!patches.empty() && shared->patches) {
      shared->patches(std::move(patches));
    }
  };
  kube::EventHandlers<kube::Node> h;
  h.on_add = [observe](const kube::Node& node, bool) { observe(node); };
  h.on_update = [observe](const kube::Node&, const kube::Node& node) { observe(node); };
  h.on_delete = [this, shared](const kube::Node& node, bool final_state_unknown) {
    if (final_state_unknown && shared->tombstone) {
      shared->tombstone(node);
    }
    if (Forget(node.meta.name)) {
      TESSERA_LOG(kInfo, "node {} deleted: its devices and usage leave the ledger", node.meta.name);
    }
  };
  return h;
}

std::vector<NodePatch> NodeRegistry::Observe(const kube::Node& node, absl::Time now) {
  std::vector<NodePatch> patches;
  MutexLock lock(&mu_);
  std::unique_ptr<NodeState>& slot = nodes_[node.meta.name];
  if (slot == nullptr) {
    slot = std::make_unique<NodeState>();
    slot->name = node.meta.name;
  }
  NodeState& s = *slot;
  s.resource_version = node.meta.resource_version;
  s.selected = options_.selector.Matches(node.meta.labels);
  s.ready = node.ready;
  s.cordoned = device::ParseCordonList(node.meta.annotations.Get(device::kDeviceCordonAnnotation));

  const std::string* alloc = node.allocatable.Find(options_.resource_count_name);
  s.allocatable_text = alloc == nullptr ? "" : *alloc;
  s.allocatable = false;
  if (alloc != nullptr) {
    absl::StatusOr<device::Quantity> q = device::ParseQuantity(*alloc);
    s.allocatable = q.ok() && !q->IsZero() && !q->IsNegative();
  }

  // The registration.
  const std::string* reg = node.meta.annotations.Find(vendor_->RegisterAnnotation());
  s.has_register = reg != nullptr;
  // The pair scores decode with the registration (HAMi's GetNodeDevices reads both): a change
  // of either decodes again, and an undecodable score fails the registration as a whole.
  const std::string* score_text = node.meta.annotations.Find(device::kNodeScoreAnnotation);
  std::optional<std::string> score;
  if (score_text != nullptr) {
    score = *score_text;
  }
  if (reg != nullptr &&
      (s.registered == nullptr || *reg != s.register_value || score != s.score_value)) {
    absl::StatusOr<device::NodeDevices> decoded = vendor_->DecodeNode(node);
    if (decoded.ok()) {
      decoded->cordoned.clear();  // applied from s.cordoned by SyncLedger
      // Plugins list devices in Go map order, which changes between writes: a canonical order
      // keeps a rewrite with the same devices from re-registering the node.
      decoded->SortByIndex();
      s.registered = std::make_shared<const device::NodeDevices>(*std::move(decoded));
      s.register_value = *reg;
      s.score_value = std::move(score);
      s.decode_error.clear();
      s.bad_value.clear();
      s.bad_score.reset();
    } else {
      s.decode_error = std::string(decoded.status().message());
      if (*reg != s.bad_value || score != s.bad_score) {
        ++s.decode_errors;
        s.bad_value = *reg;
        s.bad_score = std::move(score);
        TESSERA_LOG(kWarning, "registry: node {}: registration ignored: {}", s.name,
                    s.decode_error);
      }
    }
  } else {
    s.decode_error.clear();
  }

  // The handshake value (kept for every node; used for delimited ones).
  const std::string_view hs_key = vendor_->HandshakeAnnotation();
  const std::string hs =
      hs_key.empty() ? std::string() : std::string(node.meta.annotations.Get(hs_key));
  if (!s.handshake_seen || hs != s.handshake) {
    s.handshake_seen = true;
    s.handshake = hs;
    s.parsed = device::ParseHandshake(hs);
    s.since = now;
    if (s.parsed.kind == device::HandshakeKind::kReported) {
      s.last_report = now;
    }
  }

  Evaluate(s, now, &patches);
  return patches;
}

bool NodeRegistry::Forget(std::string_view name) {
  MutexLock lock(&mu_);
  auto it = nodes_.find(Absl(name));
  if (it == nodes_.end()) {
    return false;
  }
  ledger_->RemoveNode(name);
  nodes_.erase(it);
  return true;
}

std::vector<NodePatch> NodeRegistry::Tick(absl::Time now) {
  std::vector<NodePatch> patches;
  MutexLock lock(&mu_);
  for (auto& [name, state] : nodes_) {
    if (state->registered != nullptr &&
        state->registered->format == device::RegisterFormat::kDelimited) {
      Evaluate(*state, now, &patches);
    }
  }
  std::sort(patches.begin(), patches.end(),
            [](const NodePatch& a, const NodePatch& b) { return a.node < b.node; });
  return patches;
}

void NodeRegistry::ResetAsks() {
  MutexLock lock(&mu_);
  for (auto& [name, state] : nodes_) {
    state->patch_rv.clear();
    state->patch_at = absl::InfinitePast();
    state->patch_kind = device::HandshakeKind::kAbsent;
  }
}

void NodeRegistry::Evaluate(NodeState& s, absl::Time now, std::vector<NodePatch>* patches) {
  s.deadline.reset();
  const bool delimited =
      s.registered != nullptr && s.registered->format == device::RegisterFormat::kDelimited;
  if (!s.selected) {
    if (delimited && s.has_register) {
      EvaluateHandshake(s, now, nullptr);  // keeps the deadline visible; writes nothing
    }
    s.availability = Availability::kNotSelected;
    s.detail =
        fmt::format("labels do not match --node-label-selector {}", options_.selector.ToString());
  } else if (!s.has_register || s.registered == nullptr) {
    s.availability = Availability::kNoRegistration;
    if (!s.has_register) {
      s.detail = s.registered == nullptr
                     ? fmt::format("no {} annotation", vendor_->RegisterAnnotation())
                     : fmt::format("{} annotation removed; last devices kept, unavailable",
                                   vendor_->RegisterAnnotation());
    } else {
      s.detail = fmt::format("registration does not decode: {}", s.decode_error);
    }
  } else if (delimited) {
    EvaluateHandshake(s, now, patches);
  } else if (s.ready != kube::ConditionStatus::kTrue) {
    s.availability = Availability::kNotReady;
    s.detail = s.ready == kube::ConditionStatus::kFalse ? "node Ready condition is False"
                                                        : "node Ready condition is Unknown";
  } else if (!s.allocatable) {
    s.availability = Availability::kNoAllocatable;
    s.detail = s.allocatable_text.empty()
                   ? fmt::format("no allocatable {}", options_.resource_count_name)
                   : fmt::format("allocatable {} is \"{}\"", options_.resource_count_name,
                                 s.allocatable_text);
  } else {
    s.availability = Availability::kAvailable;
    s.detail = fmt::format("node Ready, allocatable {}={}", options_.resource_count_name,
                           s.allocatable_text);
  }
  SyncLedger(s);
}

void NodeRegistry::EvaluateHandshake(NodeState& s, absl::Time now,
                                     std::vector<NodePatch>* patches) {
  const std::string_view key = vendor_->HandshakeAnnotation();
  if (key.empty()) {
    s.availability = Availability::kAvailable;
    s.detail = "vendor has no handshake";
    return;
  }
  const absl::Duration timeout = options_.handshake_timeout;
  using device::HandshakeKind;
  if (s.parsed.kind == HandshakeKind::kDeleted) {
    s.availability = Availability::kHandshakeDeleted;
    s.detail = fmt::format("handshake \"{}\": timed out by a scheduler; waiting for the plugin",
                           s.handshake);
    return;
  }
  bool usable_time = false;
  absl::Time deadline = s.since + timeout;
  if (s.parsed.kind == HandshakeKind::kRequesting && s.parsed.time.has_value() &&
      *s.parsed.time <= now + timeout) {
    usable_time = true;
    deadline = *s.parsed.time + timeout;
  }
  s.deadline = deadline;
  if (now < deadline) {
    s.availability = Availability::kAvailable;
    s.detail =
        s.parsed.kind == HandshakeKind::kRequesting
            ? fmt::format("handshake requested; plugin must report before {}", UtcText(deadline))
            : fmt::format("plugin reported; alive until {}", UtcText(deadline));
    if (patches != nullptr && !(s.parsed.kind == HandshakeKind::kRequesting && usable_time)) {
      AskPatch(s, device::FormatHandshakeRequesting(s.since), now, patches);
    }
  } else {
    s.availability = Availability::kHandshakeTimeout;
    s.detail = fmt::format("no report from the device plugin since {} (handshake \"{}\")",
                           UtcText(deadline - timeout), s.handshake);
    if (patches != nullptr) {
      AskPatch(s, device::FormatHandshakeDeleted(now), now, patches);
    }
  }
}

void NodeRegistry::AskPatch(NodeState& s, std::string value, absl::Time now,
                            std::vector<NodePatch>* patches) {
  // One ask per (resourceVersion, kind of write), repeated only after the retry interval.
  const device::HandshakeKind kind = device::ParseHandshake(value).kind;
  if (s.patch_rv == s.resource_version && s.patch_kind == kind &&
      now < s.patch_at + options_.patch_retry_interval) {
    return;
  }
  s.patch_kind = kind;
  s.patch_rv = s.resource_version;
  s.patch_at = now;
  patches->push_back(NodePatch{s.name, std::string(vendor_->HandshakeAnnotation()),
                               std::move(value), s.resource_version});
}

void NodeRegistry::SyncLedger(NodeState& s) {
  if (s.registered == nullptr) {
    return;
  }
  auto want = std::make_shared<device::NodeDevices>(*s.registered);
  want->node = s.name;
  want->cordoned = s.cordoned;
  if (s.availability != Availability::kAvailable) {
    for (device::DeviceInfo& d : want->devices) {
      d.health = false;
    }
  }
  if (s.in_ledger != nullptr && SameDevices(*s.in_ledger, *want)) {
    return;
  }
  std::shared_ptr<const device::NodeDevices> frozen = std::move(want);
  absl::Status st = ledger_->SetNode(frozen);
  if (!st.ok()) {
    s.ledger_error = std::string(st.message());
    TESSERA_LOG(kWarning, "registry: node {}: ledger refused the registration: {}", s.name,
                s.ledger_error);
    return;
  }
  s.ledger_error.clear();
  s.in_ledger = std::move(frozen);
}

NodeStatus NodeRegistry::StatusOf(const NodeState& s) const {
  NodeStatus out;
  out.name = s.name;
  out.resource_version = s.resource_version;
  if (s.has_register && s.registered != nullptr) {
    out.format = s.registered->format == device::RegisterFormat::kDelimited ? NodeFormat::kDelimited
                                                                            : NodeFormat::kJson;
  }
  out.selected = s.selected;
  out.availability = s.availability;
  out.detail = s.detail;
  out.in_ledger = s.in_ledger != nullptr;
  out.devices = s.registered == nullptr ? 0 : s.registered->devices.size();
  out.cordoned = s.cordoned.size();
  if (out.format == NodeFormat::kDelimited) {
    out.handshake = s.handshake;
    out.handshake_since = s.since;
    out.handshake_deadline = s.deadline;
    out.last_report = s.last_report;
  }
  out.decode_error = s.decode_error;
  out.decode_errors = s.decode_errors;
  out.ledger_error = s.ledger_error;
  return out;
}

std::vector<NodeStatus> NodeRegistry::Status() const {
  std::vector<NodeStatus> out;
  MutexLock lock(&mu_);
  out.reserve(nodes_.size());
  for (const auto& [name, state] : nodes_) {
    out.push_back(StatusOf(*state));
  }
  std::sort(out.begin(), out.end(),
            [](const NodeStatus& a, const NodeStatus& b) { return a.name < b.name; });
  return out;
}

std::optional<NodeStatus> NodeRegistry::Find(std::string_view name) const {
  MutexLock lock(&mu_);
  auto it = nodes_.find(Absl(name));
  if (it == nodes_.end()) {
    return std::nullopt;
  }
  return StatusOf(*it->second);
}

std::vector<std::shared_ptr<const device::NodeDevices>> NodeRegistry::Registrations() const {
  std::vector<std::shared_ptr<const device::NodeDevices>> out;
  {
    MutexLock lock(&mu_);
    for (const auto& [name, state] : nodes_) {
      if (state->in_ledger != nullptr) {
        out.push_back(state->in_ledger);
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->node < b->node; });
  return out;
}

// ---- HandshakeWriter --------------------------------------------------------------------------

HandshakeWriter::HandshakeWriter(kube::ApiClient* client, Options options)
    : client_(client), options_(std::move(options)) {}

HandshakeWriter::Outcome HandshakeWriter::Write(const NodePatch& patch) {
  if (options_.is_leader && !options_.is_leader()) {
    return Outcome::kSkipped;
  }
  kube::MetadataPatch mp;
  mp.annotations.emplace_back(patch.key, patch.value);
  if (!patch.resource_version.empty()) {
    mp.resource_version = patch.resource_version;
  }
  absl::StatusOr<kube::Node> result = client_->PatchNodeMetadata(patch.node, mp);
  if (result.ok()) {
    written_.fetch_add(1, std::memory_order_relaxed);
    return Outcome::kWritten;
  }
  if (absl::IsAborted(result.status())) {
    conflicts_.fetch_add(1, std::memory_order_relaxed);
    TESSERA_VLOG(1, "registry: handshake {}={} on node {}: conflict, node changed", patch.key,
                 patch.value, patch.node);
    return Outcome::kConflict;
  }
  if (absl::IsNotFound(result.status())) {
    return Outcome::kNotFound;
  }
  failures_.fetch_add(1, std::memory_order_relaxed);
  TESSERA_LOG(kWarning, "registry: handshake {}={} on node {} failed: {}", patch.key, patch.value,
              patch.node, result.status().ToString());
  return Outcome::kFailed;
}

HandshakeWriter::Summary HandshakeWriter::WriteAll(const std::vector<NodePatch>& patches) {
  Summary s;
  for (const NodePatch& p : patches) {
    switch (Write(p)) {
      case Outcome::kWritten:
        ++s.written;
        break;
      case Outcome::kConflict:
        ++s.conflicts;
        break;
      case Outcome::kNotFound:
        ++s.not_found;
        break;
      case Outcome::kSkipped:
        ++s.skipped;
        break;
      case Outcome::kFailed:
        ++s.failed;
        break;
    }
  }
  return s;
}

}  // namespace tessera::accounting
