#include "tessera/extender/wire.h"

#include <string>
#include <utility>

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

}  // namespace
}  // namespace tessera::extender
