// File: tessera/extender/wire.h
//
// The kube-scheduler extender wire types (docs/k8s-protocol.md §1.1, docs/hami-protocol.md §3) and
// their JSON codecs. The scheduler sends Go field names without JSON tags ("Pod", "NodeNames",
// ...); Go decodes keys case-insensitively, so the decoders here accept any case ("nodenames",
// "NODENAMES"): a key goes to the field whose name equals it, else to the one it equals under
// ASCII case folding, and when several keys reach one field the last one wins, as encoding/json
// does. `null` is accepted for every optional member.
//
//   absl::StatusOr<FilterArgs> args = DecodeFilterArgs(body);
//   if (!args.ok()) { /* 400 with args.status().message(), or 200 with it as the Error when
//                        it is kMissingPodMessage (as HAMi answers) */ }
//   FilterResult result = ...;
//   std::string reply = EncodeFilterResult(result);  // always 200
//
// Thread safety: pure functions and plain structs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

#include "tessera/kube/objects.h"

namespace tessera::extender {

// The largest request body the extender reads (HAMi caps bodies at 1 MiB); larger ones get 413.
inline constexpr size_t kMaxRequestBytes = 1 << 20;

// One node of a full `Nodes` request (nodeCacheCapable: false). `raw` is the node's JSON
// object exactly as received, so a reply in the `Nodes` form can echo the chosen node back.
struct WireNode {
  kube::Node node;
  std::string raw;
};

// ExtenderArgs: the request to /filter (and to a prioritize verb).
struct FilterArgs {
  kube::Pod pod;
  // The pod's JSON object exactly as received (for events and logs; never re-parsed).
  std::string raw_pod;
  // NodeNames, when the scheduler is nodeCacheCapable (nullopt when absent or null).
  std::optional<std::vector<std::string>> node_names;
  // Nodes.items, when it is not (nullopt when absent or null).
  std::optional<std::vector<WireNode>> nodes;

  // The candidate names in request order: node_names if present, else the names of `nodes`.
  std::vector<std::string> CandidateNames() const;
};

// ExtenderFilterResult. Encoded with Go's field names; members that are nullopt are written
// as null, exactly as Go's encoding/json writes nil slices and maps.
struct FilterResult {
  std::optional<std::vector<std::string>> node_names;
  // Nodes.items, as raw JSON objects (WireNode::raw) for a request that came with Nodes.
  std::optional<std::vector<std::string>> nodes;
  std::map<std::string, std::string> failed_nodes;
  std::map<std::string, std::string> failed_and_unresolvable_nodes;
  std::string error;
};

// ExtenderBindingArgs: the request to /bind.
struct BindArgs {
  std::string pod_name;
  std::string pod_namespace;
  std::string pod_uid;
  std::string node;
};

// ExtenderBindingResult. An empty error is success.
struct BindResult {
  std::string error;
};

// One node's victims (Victims / MetaVictims): the pods by uid, in the order given, and how many
// PodDisruptionBudgets their eviction violates.
struct WireVictims {
  std::vector<std::string> pod_uids;
  int64_t num_pdb_violations = 0;
  friend bool operator==(const WireVictims&, const WireVictims&) = default;
};

// ExtenderPreemptionArgs: the request to /preempt. kube-scheduler sends NodeNameToMetaVictims
// (uids only) to a nodeCacheCapable extender, else NodeNameToVictims (whole pods); either form
// decodes to `victims` (a full pod to its metadata.uid). Since Kubernetes 1.38 a node may come
// with no victims (the in-tree dry run found none, e.g. for resources it ignores).
struct PreemptArgs {
  kube::Pod pod;
  std::string raw_pod;  // as received (for logs; never re-parsed)
  std::map<std::string, WireVictims> victims;
  bool meta = false;  // which form came (NodeNameToMetaVictims)
};

// ExtenderPreemptionResult: per node the victims the extender agrees to (a subset of the nodes
// it was given; a node left out is not a candidate).
struct PreemptResult {
  std::map<std::string, WireVictims> victims;
};

// The message of DecodeFilterArgs' error when the request has no pod (absent or null). HAMi
// answers that case with 200 and this text in "Error" rather than with a 400.
inline constexpr char kMissingPodMessage[] = "extender args missing pod";

// InvalidArgument with a message fit for a 400 body when `json` does not start with a JSON
// object of the right shape (a wrong type, malformed JSON, a Pod or Node that kube::DecodePod /
// kube::DecodeNode rejects), or the pod is missing (kMissingPodMessage). Keys are matched as
// Go's encoding/json does: exact name first, else ASCII case-insensitively; a repeated key: the
// last one wins. Unknown keys are ignored, and so is anything after the first JSON value (Go's
// json.Decoder reads one value). A body that is not an object (`[]`, `"x"`, `null`) is rejected.
// Strings in NodeNames or BindArgs that are JSON null decode to "" (Go leaves them unset).
// The first value is validated whole, values of unknown keys included, so malformed JSON
// anywhere in it is an error. Difference from Go: invalid UTF-8 is an error (Go substitutes
// U+FFFD).
absl::StatusOr<FilterArgs> DecodeFilterArgs(std::string_view json);
// DecodeBindArgs also requires PodName and Node to be valid Kubernetes names (RFC 1123
// subdomains) and PodNamespace a valid namespace (an RFC 1123 label): an empty or malformed name
// is an InvalidArgument naming the field, so that no API call is built from it. PodUID may be
// empty (then no uid precondition applies).
absl::StatusOr<BindArgs> DecodeBindArgs(std::string_view json);

// The pod as DecodeFilterArgs (missing: kMissingPodMessage); NodeNameToVictims or
// NodeNameToMetaVictims, absent or null meaning no nodes, both present (non-null) an
// InvalidArgument; a node whose value or Pods is null (or Pods is []) has no victims; a victim
// without a uid (null, a full pod without metadata.uid, a MetaPod without UID), a NumPDBViolations
// that is negative or not an integer in int64 range (1.5, 1e2, "1"), or a node name that is not
// an RFC 1123 subdomain is an InvalidArgument naming the node. Full victim pods are decoded by
// kube::DecodePod. Keys match as in DecodeFilterArgs, except that a repeated NodeNameTo… key adds
// its nodes to those already read, as Go decodes into the existing map (a node repeated within
// one map is replaced whole).
absl::StatusOr<PreemptArgs> DecodePreemptArgs(std::string_view json);

// The replies, byte for byte as Go's json.Marshal writes them (keys in struct order, no
// whitespace). Strings are escaped as encoding/json does by default: \" \\ \b \f \n \r \t,
// other control bytes and <, >, & as \u00XX, U+2028/U+2029 as \u2028/\u2029, and each byte of
// invalid UTF-8 as \ufffd. Map keys are sorted bytewise, as Go sorts them.
//
// {"Nodes":…,"NodeNames":…,"FailedNodes":{…},"FailedAndUnresolvableNodes":{…},"Error":"…"}
// with "Nodes" as {"metadata":{},"items":[…]} when present; the items are copied verbatim.
std::string EncodeFilterResult(const FilterResult& result);
// {"NodeNameToMetaVictims":{"<node>":{"Pods":[{"UID":"…"}],"NumPDBViolations":n}}}, nodes
// sorted; a node without victims has "Pods":[].
std::string EncodePreemptResult(const PreemptResult& result);
// {"Error":"…"}
std::string EncodeBindResult(const BindResult& result);

}  // namespace tessera::extender
