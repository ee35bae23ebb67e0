#include "tessera/extender/wire.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::extender {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kPod[] =
    R"({"metadata":{"name":"podname","namespace":"ns","uid":"u1"},"spec":{"containers":null},"status":{}})";
constexpr char kNode1[] = R"({"metadata":{"name":"node1"},"status":{"allocatable":{"cpu":"4"}}})";
constexpr char kNode2[] = R"({"metadata":{"name":"node2"}})";

std::string Body(const std::string& pod_key, const std::string& nodes_key,
                 const std::string& names_key) {
  return "{\"" + pod_key + "\":" + kPod + ",\"" + nodes_key + "\":null,\"" + names_key +
         "\":[\"node1\",\"node2\"]}";
}

// The request kube-scheduler sends with nodeCacheCapable: true (docs/k8s-protocol.md §1.1).
TEST(DecodeFilterArgs, PascalCaseNodeNames) {
  absl::StatusOr<FilterArgs> args = DecodeFilterArgs(Body("Pod", "Nodes", "NodeNames"));
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->pod.meta.name, "podname");
  EXPECT_EQ(args->pod.meta.ns, "ns");
  EXPECT_EQ(args->pod.meta.uid, "u1");
  EXPECT_EQ(args->raw_pod, kPod);
  EXPECT_FALSE(args->nodes.has_value());
  ASSERT_TRUE(args->node_names.has_value());
  EXPECT_THAT(*args->node_names, ElementsAre("node1", "node2"));
  EXPECT_THAT(args->CandidateNames(), ElementsAre("node1", "node2"));
}

// HAMi's own tests and other callers send the lowercased form; Go accepts any case.
TEST(DecodeFilterArgs, LowercaseAndMixedCase) {
  for (const auto& [p, n, nn] :
       {std::tuple<std::string, std::string, std::string>{"pod", "nodes", "nodenames"},
        {"POD", "NODES", "NODENAMES"},
        {"pOd", "nOdes", "nodeNames"}}) {
    absl::StatusOr<FilterArgs> args = DecodeFilterArgs(Body(p, n, nn));
    ASSERT_TRUE(args.ok()) << p << ": " << args.status();
    EXPECT_EQ(args->pod.meta.name, "podname");
    EXPECT_EQ(args->raw_pod, kPod);
    ASSERT_TRUE(args->node_names.has_value());
    EXPECT_THAT(*args->node_names, ElementsAre("node1", "node2"));
  }
}

// Go: an exact match is preferred to a folded one only within one key's lookup; between two
// keys that map to the same field, the later one wins.
TEST(DecodeFilterArgs, RepeatedKeysLastWins) {
  absl::StatusOr<FilterArgs> args = DecodeFilterArgs(std::string(R"({"NodeNames":["a"],"Pod":)") +
                                                     kPod + R"(,"nodenames":["b","c"]})");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(*args->node_names, ElementsAre("b", "c"));

  args = DecodeFilterArgs(std::string(R"({"NodeNames":["a"],"Pod":)") + kPod +
                          R"(,"NODENAMES":null})");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_FALSE(args->node_names.has_value());
}

TEST(DecodeFilterArgs, NullAndAbsentMembers) {
  absl::StatusOr<FilterArgs> args =
      DecodeFilterArgs(std::string(R"({"Pod":)") + kPod + R"(,"Nodes":null,"NodeNames":null})");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_FALSE(args->nodes.has_value());
  EXPECT_FALSE(args->node_names.has_value());
  EXPECT_TRUE(args->CandidateNames().empty());

  args = DecodeFilterArgs(std::string(R"({"Pod":)") + kPod + "}");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_FALSE(args->nodes.has_value());
  EXPECT_FALSE(args->node_names.has_value());

  args = DecodeFilterArgs(std::string(R"({"Pod":)") + kPod + R"(,"NodeNames":[]})");
  ASSERT_TRUE(args.ok()) << args.status();
  ASSERT_TRUE(args->node_names.has_value());
  EXPECT_TRUE(args->node_names->empty());
}

TEST(DecodeFilterArgs, MissingPod) {
  for (const char* body : {R"({"NodeNames":["a"]})", R"({"Pod":null,"NodeNames":["a"]})", "{}"}) {
    absl::StatusOr<FilterArgs> args = DecodeFilterArgs(body);
    ASSERT_FALSE(args.ok()) << body;
    EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(args.status().message(), kMissingPodMessage) << body;
  }
}

TEST(DecodeFilterArgs, WrongTypes) {
  const std::string pod = kPod;
  const std::pair<std::string, std::string> cases[] = {
      {R"({"Pod":"x"})", "Pod: expected object"},
      {R"({"Pod":[]})", "Pod: expected object"},
      {"{\"Pod\":" + pod + R"(,"NodeNames":"node1"})", "NodeNames: expected array"},
      {"{\"Pod\":" + pod + R"(,"NodeNames":[1]})", "NodeNames[0]: expected string"},
      {"{\"Pod\":" + pod + R"(,"Nodes":[]})", "Nodes: expected object"},
      {"{\"Pod\":" + pod + R"(,"Nodes":{"items":{}}})", "Nodes.items: expected array"},
      {"{\"Pod\":" + pod + R"(,"Nodes":{"items":[1]}})", "Nodes.items[0]: expected object"},
      // The pod itself is decoded by kube::DecodePod, whose message names the field.
      {R"({"Pod":{"metadata":{"name":7}}})", "metadata.name: expected string"},
  };
  for (const auto& [body, want] : cases) {
    absl::StatusOr<FilterArgs> args = DecodeFilterArgs(body);
    ASSERT_FALSE(args.ok()) << body;
    EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(args.status().message()), HasSubstr(want)) << body;
  }
}

TEST(DecodeFilterArgs, NotAnObjectOrMalformed) {
  for (const char* body : {"", "   ", "[]", "null", "\"Pod\"", "42", "{", R"({"Pod":)",
                           R"({"Pod" {}})", R"({"Pod":{"metadata":{}},})"}) {
    absl::StatusOr<FilterArgs> args = DecodeFilterArgs(body);
    ASSERT_FALSE(args.ok()) << body;
    EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_THAT(std::string(args.status().message()), HasSubstr("extender args")) << body;
  }
}

// Go's json.Decoder reads one value and ignores what follows (docs/k8s-protocol.md §1.3).
TEST(DecodeFilterArgs, TrailingDataIgnored) {
  const std::string body = std::string("\n {\"Pod\":") + kPod + R"(,"NodeNames":["n"]})";
  for (const std::string& trailer : {std::string("\n"), std::string(" {\"Pod\":null}"),
                                     std::string("garbage \"unterminated"), std::string("]]]")}) {
    absl::StatusOr<FilterArgs> args = DecodeFilterArgs(body + trailer);
    ASSERT_TRUE(args.ok()) << trailer << ": " << args.status();
    EXPECT_THAT(*args->node_names, ElementsAre("n"));
  }
}

TEST(DecodeFilterArgs, UnknownKeysIgnored) {
  absl::StatusOr<FilterArgs> args =
      DecodeFilterArgs(std::string(R"({"Extra":{"a":[1,2,{"b":null}]},"Pod":)") + kPod +
                       R"(,"NodeNamesX":5,"NodeNames":["n"],"Nodes ":true})");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(*args->node_names, ElementsAre("n"));
  EXPECT_FALSE(args->nodes.has_value());
}

// Go's decoder checks the whole value; so does Tessera, inside values it does not read too. The
// first case was found by extender_args_fuzz: a pod holding `ad\` was accepted and passed on.
TEST(DecodeFilterArgs, MalformedJsonInsideSkippedValuesRejected) {
  for (const std::string& body :
       {std::string(R"({"pod":{"metadata":{"namme{":ad\}}}}"nodenames":null})"),
        std::string(R"({"Extra":{"a":tru},"Pod":)") + kPod + "}",
        std::string(R"({"Pod":{"metadata":{"name":"p","x":[1,,2]}},"NodeNames":["n"]})"),
        std::string(R"({"Pod":)") + kPod + R"(,"NodeNames":["n"],"Zzz":01})"}) {
    absl::StatusOr<FilterArgs> args = DecodeFilterArgs(body);
    ASSERT_FALSE(args.ok()) << body;
    EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(args.status().message(), HasSubstr("invalid JSON")) << body;
  }
  EXPECT_FALSE(DecodeBindArgs(R"({"PodName":"p","Node":"n","X":nul})").ok());
}

// nodeCacheCapable: false sends whole nodes; each keeps its exact text for the reply.
TEST(DecodeFilterArgs, NodesForm) {
  const std::string body = std::string(R"({"Pod":)") + kPod +
                           R"(,"Nodes":{"metadata":{"resourceVersion":"9"},"items":[)" + kNode1 +
                           " ,\n" + kNode2 + R"(]},"NodeNames":null})";
  absl::StatusOr<FilterArgs> args = DecodeFilterArgs(body);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_FALSE(args->node_names.has_value());
  ASSERT_TRUE(args->nodes.has_value());
  ASSERT_EQ(args->nodes->size(), 2u);
  EXPECT_EQ((*args->nodes)[0].node.meta.name, "node1");
  EXPECT_EQ((*args->nodes)[0].node.allocatable.Get("cpu"), "4");
  EXPECT_EQ((*args->nodes)[0].raw, kNode1);
  EXPECT_EQ((*args->nodes)[1].raw, kNode2);
  EXPECT_THAT(args->CandidateNames(), ElementsAre("node1", "node2"));

  // NodeList's keys are matched like any Go field: case-insensitively; null items is empty.
  args = DecodeFilterArgs(std::string(R"({"pod":)") + kPod + R"(,"nodes":{"ITEMS":[)" + kNode2 +
                          "]}}");
  ASSERT_TRUE(args.ok()) << args.status();
  ASSERT_EQ(args->nodes->size(), 1u);
  EXPECT_EQ((*args->nodes)[0].node.meta.name, "node2");
  args = DecodeFilterArgs(std::string(R"({"pod":)") + kPod + R"(,"nodes":{"items":null}})");
  ASSERT_TRUE(args.ok()) << args.status();
  ASSERT_TRUE(args->nodes.has_value());
  EXPECT_TRUE(args->nodes->empty());
}

TEST(DecodeFilterArgs, EscapedStrings) {
  absl::StatusOr<FilterArgs> args =
      DecodeFilterArgs(std::string(R"({"Pod":)") + kPod + R"(,"Node\u004eames":["a\"b\u00e9"]})");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(*args->node_names, ElementsAre("a\"b\xc3\xa9"));
}

TEST(DecodeBindArgs, PascalCaseAndLowercase) {
  for (
      const char* body :
      {R"({"PodName":"mypodname","PodNamespace":"mypodnamespace","PodUID":"mypoduid","Node":"mynode"})",
       R"({"podName":"mypodname","podNamespace":"mypodnamespace","podUID":"mypoduid","node":"mynode"})",
       R"({"podname":"mypodname","podnamespace":"mypodnamespace","poduid":"mypoduid","NODE":"mynode"} trailing)"}) {
    absl::StatusOr<BindArgs> args = DecodeBindArgs(body);
    ASSERT_TRUE(args.ok()) << body << ": " << args.status();
    EXPECT_EQ(args->pod_name, "mypodname");
    EXPECT_EQ(args->pod_namespace, "mypodnamespace");
    EXPECT_EQ(args->pod_uid, "mypoduid");
    EXPECT_EQ(args->node, "mynode");
  }
}

TEST(DecodeBindArgs, NullsAndErrors) {
  absl::StatusOr<BindArgs> args =
      DecodeBindArgs(R"({"PodName":"p","PodNamespace":"ns","PodUID":null,"Node":"n","Other":[1]})");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->pod_uid, "");
  EXPECT_EQ(args->node, "n");

  for (const char* body : {R"({"PodName":1})", R"({"Node":{}})", "[]", "", "{\"PodName\":\"x"}) {
    args = DecodeBindArgs(body);
    ASSERT_FALSE(args.ok()) << body;
    EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(args.status().message()), HasSubstr("extender binding args"));
  }
  EXPECT_THAT(std::string(DecodeBindArgs(R"({"PodName":1})").status().message()),
              HasSubstr("PodName: expected string"));
}

// An empty name made GET .../pods/ a LIST of the whole collection, and a name with '/' or '%'
// could address another object: such a bind is refused before any API call.
TEST(DecodeBindArgs, NamesMustBeKubernetesNames) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"PodNamespace":"ns","Node":"n"})", "PodName is required"},
      {R"({"PodName":null,"PodNamespace":"ns","Node":"n"})", "PodName is required"},
      {R"({"PodName":"p","Node":"n"})", "PodNamespace is required"},
      {R"({"PodName":"p","PodNamespace":"ns","Node":""})", "Node is required"},
      {R"({"PodName":"../nodes/x","PodNamespace":"ns","Node":"n"})",
       "PodName \"../nodes/x\" is not a valid pod name"},
      {R"({"PodName":"p","PodNamespace":"a.b","Node":"n"})",
       "PodNamespace \"a.b\" is not a valid namespace"},
      {R"({"PodName":"p","PodNamespace":"ns","Node":"N%2f1"})",
       "Node \"N%2f1\" is not a valid node name"},
  };
  for (const auto& [body, message] : cases) {
    absl::StatusOr<BindArgs> args = DecodeBindArgs(body);
    ASSERT_FALSE(args.ok()) << body;
    EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(args.status().message()), HasSubstr(message)) << body;
  }
}

// The vectors of kube-scheduler's extender/v1 TestCompatibility (docs/k8s-protocol.md §1.1).
TEST(EncodeFilterResult, GoVectors) {
  FilterResult result;
  result.node_names = std::vector<std::string>{"node1"};
  result.failed_nodes = {{"foo", "bar"}};
  result.failed_and_unresolvable_nodes = {{"baz", "qux"}};
  result.error = "myerror";
  EXPECT_EQ(EncodeFilterResult(result),
            R"({"Nodes":null,"NodeNames":["node1"],"FailedNodes":{"foo":"bar"},)"
            R"("FailedAndUnresolvableNodes":{"baz":"qux"},"Error":"myerror"})");

  EXPECT_EQ(EncodeFilterResult(FilterResult{}),
            R"({"Nodes":null,"NodeNames":null,"FailedNodes":{},)"
            R"("FailedAndUnresolvableNodes":{},"Error":""})");

  FilterResult empty_names;
  empty_names.node_names = std::vector<std::string>{};
  EXPECT_EQ(EncodeFilterResult(empty_names), R"({"Nodes":null,"NodeNames":[],"FailedNodes":{},)"
                                             R"("FailedAndUnresolvableNodes":{},"Error":""})");
}

TEST(EncodeFilterResult, NodesFormAndSortedMaps) {
  FilterResult result;
  result.nodes = std::vector<std::string>{kNode1, kNode2};
  result.failed_nodes = {{"b", "2"}, {"a", "1"}, {"B", "0"}, {"a\xc3\xa9", "3"}};
  EXPECT_EQ(EncodeFilterResult(result),
            std::string(R"({"Nodes":{"metadata":{},"items":[)") + kNode1 + "," + kNode2 +
                R"(]},"NodeNames":null,"FailedNodes":{"B":"0","a":"1","aé":"3","b":"2"},)"
                R"("FailedAndUnresolvableNodes":{},"Error":""})");
}

// Go's encoding/json string escaping (encodeState.string with escapeHTML).
TEST(EncodeResult, GoStringEscaping) {
  BindResult r;
  r.error = std::string("q\"b\\s/ <a>&\b\f\n\r\t\x01\x1f\x7f") + "\xe2\x80\xa8\xe2\x80\xa9" +
            "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80" + "\xff" + "\xc3" + "x" + "\xed\xa0\x80";
  EXPECT_EQ(EncodeBindResult(r), R"({"Error":"q\"b\\s/ \u003ca\u003e\u0026\b\f\n\r\t\u0001\u001f)"
                                 "\x7f"
                                 R"(\u2028\u2029é中😀\ufffd\ufffdx\ufffd\ufffd\ufffd"})");
  EXPECT_EQ(EncodeBindResult(BindResult{}), R"({"Error":""})");
  EXPECT_EQ(EncodeBindResult(BindResult{"myerror"}), R"({"Error":"myerror"})");
}

TEST(EncodeFilterResult, RoundTripThroughDecoderOfNames) {
  // What we encode for NodeNames decodes back to the same names.
  FilterResult result;
  result.node_names = std::vector<std::string>{"a<b>", "c&d", "e\"f", "line\nbreak"};
  const std::string reply = EncodeFilterResult(result);
  absl::StatusOr<FilterArgs> back =
      DecodeFilterArgs(std::string(R"({"Pod":)") + kPod + "," + reply.substr(1));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back->node_names, *result.node_names);
}

// ---- preempt ------------------------------------------------------------------------------------

std::string PreemptBody(const std::string& rest) {
  return std::string(R"({"Pod":)") + kPod + (rest.empty() ? "" : ",") + rest + "}";
}

WireVictims Victims(std::vector<std::string> uids, int64_t pdb) {
  WireVictims v;
  v.pod_uids = std::move(uids);
  v.num_pdb_violations = pdb;
  return v;
}

// The request kube-scheduler sends a nodeCacheCapable extender (docs/k8s-protocol.md §1.1).
TEST(DecodePreemptArgs, MetaForm) {
  absl::StatusOr<PreemptArgs> args = DecodePreemptArgs(PreemptBody(
      R"("NodeNameToVictims":null,"NodeNameToMetaVictims":{"node1":{"Pods":[{"UID":"v1"},)"
      R"({"UID":"v2"}],"NumPDBViolations":2},"node2":{"Pods":[{"UID":"v3"}],"NumPDBViolations":0}})"));
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->meta);
  EXPECT_EQ(args->pod.meta.uid, "u1");
  EXPECT_EQ(args->raw_pod, kPod);
  const std::map<std::string, WireVictims> want = {{"node1", Victims({"v1", "v2"}, 2)},
                                                   {"node2", Victims({"v3"}, 0)}};
  EXPECT_EQ(args->victims, want);
}

// Without nodeCacheCapable the victims come as whole pods; each is decoded as kube::DecodePod
// decodes a pod and counts by its metadata.uid.
TEST(DecodePreemptArgs, FullForm) {
  absl::StatusOr<PreemptArgs> args = DecodePreemptArgs(PreemptBody(
      R"("NodeNameToVictims":{"node1":{"Pods":[{"metadata":{"name":"a","namespace":"ns","uid":"ua"}},)"
      R"({"metadata":{"name":"b","uid":"ub"},"spec":{"containers":[{"name":"c"}]}}],)"
      R"("NumPDBViolations":1}},"NodeNameToMetaVictims":null)"));
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_FALSE(args->meta);
  const std::map<std::string, WireVictims> want = {{"node1", Victims({"ua", "ub"}, 1)}};
  EXPECT_EQ(args->victims, want);
}

TEST(DecodePreemptArgs, CaseInsensitiveKeys) {
  for (const std::string& rest :
       {std::string(
            R"("nodenametometavictims":{"n1":{"pods":[{"uid":"x"}],"numpdbviolations":3}})"),
        std::string(
            R"("NODENAMETOMETAVICTIMS":{"n1":{"PODS":[{"Uid":"x"}],"NumPdbViolations":3}})")}) {
    absl::StatusOr<PreemptArgs> args = DecodePreemptArgs(PreemptBody(rest));
    ASSERT_TRUE(args.ok()) << rest << ": " << args.status();
    EXPECT_TRUE(args->meta);
    const std::map<std::string, WireVictims> want = {{"n1", Victims({"x"}, 3)}};
    EXPECT_EQ(args->victims, want) << rest;
  }
  absl::StatusOr<PreemptArgs> args =
      DecodePreemptArgs(std::string(R"({"pod":)") + kPod +
                        R"(,"nodenametovictims":{"n1":{"pods":[{"metadata":{"uid":"y"}}]}}})");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_FALSE(args->meta);
  EXPECT_EQ(args->victims.at("n1"), Victims({"y"}, 0));
}

// Within one object the last of several keys that reach a field wins; a repeated map key adds
// its nodes to the map already decoded, because Go decodes into the existing map.
TEST(DecodePreemptArgs, RepeatedKeys) {
  absl::StatusOr<PreemptArgs> args = DecodePreemptArgs(PreemptBody(
      R"("NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":"a","uid":"b"}],"NumPDBViolations":4,)"
      R"("pods":[{"UID":"c"},{"UID":"d"}],"numpdbviolations":5},"n1":{"Pods":[{"UID":"e"}]}})"));
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->victims, (std::map<std::string, WireVictims>{{"n1", Victims({"e"}, 0)}}));

  args = DecodePreemptArgs(PreemptBody(
      R"("NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":"a","uid":"b"}],"NumPDBViolations":4,)"
      R"("pods":[{"UID":"c"},{"UID":"d"}],"numpdbviolations":5,"NumPDBViolations":null}})"));
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->victims, (std::map<std::string, WireVictims>{{"n1", Victims({"c", "d"}, 5)}}));

  args = DecodePreemptArgs(
      PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":"a","uid":"b"}]}},)"
                  R"("nodenametometavictims":{"n2":{"Pods":[{"UID":"c"}]}})"));
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->victims, (std::map<std::string, WireVictims>{{"n1", Victims({"b"}, 0)},
                                                               {"n2", Victims({"c"}, 0)}}));

  // null drops what came before; the later object starts a new map.
  args = DecodePreemptArgs(PreemptBody(R"("NodeNameToMetaVictims":{"n1":null},)"
                                       R"("NodeNameToMetaVictims":null,)"
                                       R"("NodeNameToMetaVictims":{"n2":null})"));
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->victims, (std::map<std::string, WireVictims>{{"n2", WireVictims{}}}));

  // The pod: the last one wins too.
  args = DecodePreemptArgs(
      R"({"Pod":{"metadata":{"uid":"first"}},"pod":{"metadata":{"uid":"second"}}})");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->pod.meta.uid, "second");
}

// Since Kubernetes 1.38 a node can come with no victims; a null node value has none either.
TEST(DecodePreemptArgs, NodesWithoutVictims) {
  absl::StatusOr<PreemptArgs> args = DecodePreemptArgs(
      PreemptBody(R"("NodeNameToMetaVictims":{"a":{"Pods":[],"NumPDBViolations":0},)"
                  R"("b":{"Pods":null},"c":null,"d":{},"e":{"Pods":[{"UID":"x"}],"Pods":[]}})"));
  ASSERT_TRUE(args.ok()) << args.status();
  ASSERT_EQ(args->victims.size(), 5u);
  for (const auto& [node, victims] : args->victims) {
    EXPECT_EQ(victims, WireVictims{}) << node;
  }

  args = DecodePreemptArgs(PreemptBody(R"("NodeNameToVictims":{"a":{"Pods":[]},"b":null})"));
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_FALSE(args->meta);
  EXPECT_EQ(args->victims, (std::map<std::string, WireVictims>{{"a", {}}, {"b", {}}}));
}

TEST(DecodePreemptArgs, NoMaps) {
  for (const std::string& rest :
       {std::string(), std::string(R"("NodeNameToVictims":null,"NodeNameToMetaVictims":null)")}) {
    absl::StatusOr<PreemptArgs> args = DecodePreemptArgs(PreemptBody(rest));
    ASSERT_TRUE(args.ok()) << rest << ": " << args.status();
    EXPECT_FALSE(args->meta);
    EXPECT_TRUE(args->victims.empty());
  }
  absl::StatusOr<PreemptArgs> args =
      DecodePreemptArgs(PreemptBody(R"("NodeNameToMetaVictims":{})"));
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->meta);
  EXPECT_TRUE(args->victims.empty());
}

TEST(DecodePreemptArgs, MissingPod) {
  for (const char* body : {R"({"NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":"a"}]}}})",
                           R"({"Pod":null,"NodeNameToMetaVictims":{}})", "{}",
                           R"({"Pod":{"metadata":{"uid":"p"}},"POD":null})"}) {
    absl::StatusOr<PreemptArgs> args = DecodePreemptArgs(body);
    ASSERT_FALSE(args.ok()) << body;
    EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(args.status().message(), kMissingPodMessage) << body;
  }
}

TEST(DecodePreemptArgs, Errors) {
  const std::pair<std::string, std::string> cases[] = {
      {PreemptBody(R"("NodeNameToVictims":{},"NodeNameToMetaVictims":{})"),
       "both NodeNameToVictims and NodeNameToMetaVictims are set"},
      {PreemptBody(R"("NodeNameToVictims":{"n1":null},"nodenametometavictims":{"n2":null})"),
       "both NodeNameToVictims and NodeNameToMetaVictims are set"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"Node_1":{"Pods":[]}})"),
       R"(NodeNameToMetaVictims: node "Node_1" is not a valid node name (an RFC 1123 subdomain))"},
      {PreemptBody(R"("NodeNameToVictims":{"":null})"),
       R"(NodeNameToVictims: node "" is not a valid node name)"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"a/b\n":null})"),
       R"(node "a/b\n" is not a valid node name)"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":""}]}})"),
       R"(NodeNameToMetaVictims["n1"].Pods[0]: victim has no UID)"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":"a"},{}]}})"),
       R"(NodeNameToMetaVictims["n1"].Pods[1]: victim has no UID)"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":null}]}})"),
       R"(NodeNameToMetaVictims["n1"].Pods[0]: victim has no UID)"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"Pods":[null]}})"),
       R"(NodeNameToMetaVictims["n1"].Pods[0]: victim is null)"},
      {PreemptBody(R"("NodeNameToVictims":{"n1":{"Pods":[{"metadata":{"name":"v"}}]}})"),
       R"(NodeNameToVictims["n1"].Pods[0]: victim pod has no metadata.uid)"},
      {PreemptBody(R"("NodeNameToVictims":{"n1":{"Pods":[{"metadata":{"name":7,"uid":"x"}}]}})"),
       R"(NodeNameToVictims["n1"].Pods[0]: Pod: metadata.name: expected string)"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"NumPDBViolations":-1}})"),
       R"(NodeNameToMetaVictims["n1"].NumPDBViolations: must not be negative, got -1)"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"NumPDBViolations":1.5}})"),
       R"(NodeNameToMetaVictims["n1"].NumPDBViolations: expected integer, got 1.5)"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"NumPDBViolations":1.0}})"),
       "expected integer, got 1.0"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"NumPDBViolations":2e1 }})"),
       "expected integer, got 2e1"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"NumPDBViolations":"1"}})"),
       R"(NodeNameToMetaVictims["n1"].NumPDBViolations: expected integer)"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"NumPDBViolations":9223372036854775808}})"),
       "integer out of int64 range: 9223372036854775808"},
      {PreemptBody(R"("NodeNameToVictims":{"n1":{"NumPDBViolations":18446744073709551615}})"),
       R"(NodeNameToVictims["n1"].NumPDBViolations: integer out of int64 range)"},
      // simdjson's validator rejects integers outside [INT64_MIN, UINT64_MAX] as malformed.
      {PreemptBody(R"("NodeNameToVictims":{"n1":{"NumPDBViolations":-9223372036854775809}})"),
       "invalid JSON"},
      {PreemptBody(R"("NodeNameToVictims":{"n1":{"NumPDBViolations":18446744073709551616}})"),
       "invalid JSON"},
      {PreemptBody(R"("NodeNameToMetaVictims":[])"), "NodeNameToMetaVictims: expected object"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"n1":[]})"),
       R"(NodeNameToMetaVictims["n1"]: expected object)"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"Pods":{}}})"),
       R"(NodeNameToMetaVictims["n1"].Pods: expected array)"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"Pods":["u"]}})"),
       R"(NodeNameToMetaVictims["n1"].Pods[0]: expected object)"},
      {PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":5}]}})"),
       R"(NodeNameToMetaVictims["n1"].Pods[0].UID: expected string)"},
      {R"({"Pod":"x"})", "Pod: expected object"},
      {R"({"Pod":{"metadata":{"name":7}}})", "Pod: metadata.name: expected string"},
  };
  for (const auto& [body, want] : cases) {
    absl::StatusOr<PreemptArgs> args = DecodePreemptArgs(body);
    ASSERT_FALSE(args.ok()) << body;
    EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_THAT(std::string(args.status().message()), HasSubstr("extender preemption args: "))
        << body;
    EXPECT_THAT(std::string(args.status().message()), HasSubstr(want)) << body;
  }
  // Go reads -0 as 0; the largest int64 is accepted.
  absl::StatusOr<PreemptArgs> args =
      DecodePreemptArgs(PreemptBody(R"("NodeNameToMetaVictims":{"a":{"NumPDBViolations":-0},)"
                                    R"("b":{"NumPDBViolations":9223372036854775807}})"));
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->victims.at("a").num_pdb_violations, 0);
  EXPECT_EQ(args->victims.at("b").num_pdb_violations, INT64_MAX);
}

TEST(DecodePreemptArgs, NotAnObjectOrMalformed) {
  for (const std::string& body :
       {std::string(), std::string("[]"), std::string("null"), std::string("{"),
        PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":"a"},]}})"),
        PreemptBody(R"("NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":"a"}]})"),
        PreemptBody(R"("NodeNameToVictims":{"n1":{"Pods":[{"metadata":{"uid":"a",}}]}})"),
        PreemptBody(R"("Other":{"x":tru},"NodeNameToMetaVictims":{})")}) {
    absl::StatusOr<PreemptArgs> args = DecodePreemptArgs(body);
    ASSERT_FALSE(args.ok()) << body;
    EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_THAT(std::string(args.status().message()), HasSubstr("extender preemption args"))
        << body;
  }
  // What follows the first value is ignored, as Go's json.Decoder ignores it.
  absl::StatusOr<PreemptArgs> args =
      DecodePreemptArgs(PreemptBody(R"("NodeNameToMetaVictims":{"n1":null})") + " ]] {\"x");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->victims.size(), 1u);
}

// json.Marshal of ExtenderPreemptionResult: struct order, map keys sorted bytewise.
TEST(EncodePreemptResult, GoBytes) {
  PreemptResult result;
  result.victims["n2"] = WireVictims{};
  result.victims["n1"] = Victims({"u1", "u2"}, 1);
  EXPECT_EQ(EncodePreemptResult(result),
            R"({"NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":"u1"},{"UID":"u2"}],)"
            R"("NumPDBViolations":1},"n2":{"Pods":[],"NumPDBViolations":0}}})");
  EXPECT_EQ(EncodePreemptResult(PreemptResult{}), R"({"NodeNameToMetaVictims":{}})");

  PreemptResult escaped;
  escaped.victims["b.node"] = Victims({"a<b\"c\x01"}, INT64_MAX);
  escaped.victims["a-node"] = Victims({"x"}, 0);
  escaped.victims["A"] = Victims({}, 7);
  EXPECT_EQ(EncodePreemptResult(escaped),
            R"({"NodeNameToMetaVictims":{"A":{"Pods":[],"NumPDBViolations":7},)"
            R"("a-node":{"Pods":[{"UID":"x"}],"NumPDBViolations":0},)"
            R"("b.node":{"Pods":[{"UID":"a\u003cb\"c\u0001"}],)"
            R"("NumPDBViolations":9223372036854775807}}})");
}

TEST(EncodePreemptResult, RoundTrip) {
  PreemptResult result;
  result.victims["node-1"] = Victims({"a<b>", "c&d", "e\"f", "line\nbreak", "\xc3\xa9"}, 3);
  result.victims["node-2"] = WireVictims{};
  result.victims["node.3"] = Victims({"z"}, 0);
  const std::string reply = EncodePreemptResult(result);
  absl::StatusOr<PreemptArgs> back =
      DecodePreemptArgs(std::string(R"({"Pod":)") + kPod + "," + reply.substr(1));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->meta);
  EXPECT_EQ(back->victims, result.victims);
}

}  // namespace
}  // namespace tessera::extender
