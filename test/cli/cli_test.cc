// Runs the tessera binary the way a user does and checks what it prints and its exit code.
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <nlohmann/json.hpp>

#include "tessera/testing/apisim_process.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int exit_code = -1;
  std::string output;  // stdout (and stderr when merged)
};

// Runs `command` with sh in the source tree.
Result RunShell(const std::string& command, bool merge_stderr = true) {
  std::string cmd = std::string("cd '") + TESSERA_SOURCE_PATH + "' && " + command +
                    (merge_stderr ? " 2>&1" : " 2>/dev/null");
  Result r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    return r;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) {
    r.output.append(buf.data(), n);
  }
  int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

Result RunTessera(const std::string& args, bool merge_stderr = true) {
  return RunShell(std::string("'") + TESSERA_BINARY_PATH + "' " + args, merge_stderr);
}

constexpr char kExplain[] =
    "explain --cluster examples/cluster.yaml --pod examples/pod.yaml --now 1764670500 ";

TEST(CliTest, ExplainExampleChoosesANodeAndWritesMatchingAnnotations) {
  Result r = RunTessera(std::string(kExplain) + "-o json", /*merge_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json doc = nlohmann::json::parse(r.output);
  EXPECT_EQ(doc["pod"], "ml/finetune-0");
  ASSERT_TRUE(doc["node"].is_string());
  const std::string node = doc["node"];
  EXPECT_EQ(doc["annotations"]["hami.io/vgpu-node"], node);
  EXPECT_EQ(doc["annotations"]["hami.io/vgpu-time"], "1764670500");
  EXPECT_EQ(doc["annotations"]["hami.io/vgpu-devices-to-allocate"],
            doc["annotations"]["hami.io/vgpu-devices-allocated"]);
  ASSERT_EQ(doc["containers"].size(), 1u);
  ASSERT_EQ(doc["containers"][0].size(), 1u);
  const std::string uuid = doc["containers"][0][0]["uuid"];
  EXPECT_EQ(doc["annotations"]["hami.io/vgpu-devices-allocated"], uuid + ",NVIDIA,8000,30:;");
  EXPECT_EQ(doc["labels"]["hami.io/vgpu-node"], node);
  EXPECT_TRUE(doc["nodes"][node]["fit"]);
  EXPECT_EQ(doc["nodes"]["cpu-1"]["reasons"][0], "node unregistered");
  // Binpack (the default node policy) prefers the node with the highest score.
  for (auto& [name, n] : doc["nodes"].items()) {
    if (n["fit"].get<bool>()) {
      EXPECT_LE(n["score"].get<double>(), doc["nodes"][node]["score"].get<double>()) << name;
    }
  }
}

TEST(CliTest, ExplainSpreadPrefersTheEmptiestNode) {
  Result r = RunTessera(std::string(kExplain) + "--node-policy spread -o json", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json doc = nlohmann::json::parse(r.output);
  const std::string node = doc["node"];
  for (auto& [name, n] : doc["nodes"].items()) {
    if (n["fit"].get<bool>()) {
      EXPECT_GE(n["score"].get<double>(), doc["nodes"][node]["score"].get<double>()) << name;
    }
  }
}

TEST(CliTest, ExplainTextNamesTheDecisionAndEveryNode) {
  Result r = RunTessera(kExplain);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("pod ml/finetune-0 → node "));
  EXPECT_THAT(r.output, HasSubstr("annotations to write:"));
  EXPECT_THAT(r.output, HasSubstr("hami.io/vgpu-devices-allocated: GPU-"));
  EXPECT_THAT(r.output, HasSubstr("cpu-1"));
  EXPECT_THAT(r.output, HasSubstr("node unregistered"));
}

// Ascend (docs/ascend.md): the pod as submitted goes through HAMi's webhook first, then the
// chip's rules; the NVIDIA node lacks the pod's devices rather than being unregistered.
TEST(CliTest, ExplainAnAscendPodShowsTheWebhookAndTheChipsAnnotations) {
  Result r = RunTessera(
      "explain --cluster test/testdata/cli/ascend-cluster.yaml --pod "
      "test/testdata/cli/ascend-pod.yaml --device-config "
      "test/testdata/cli/ascend-device-config.yaml --now 1765155600");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("admission webhook: container \"main\": huawei.com/Ascend910B3-memory "
                        "3000 becomes 16384 (template vir05_1c_16g)\n"));
  EXPECT_THAT(r.output, HasSubstr("pod ml/infer-1 → node npu-1 "));
  EXPECT_THAT(r.output, HasSubstr("container main: npu1-6 (#6 Ascend910B3) 16384 MiB"));
  EXPECT_THAT(r.output, HasSubstr("hami.io/Ascend910B3-devices-allocated: "
                                  "npu1-6,Ascend910B3,16384,0:;\n"));
  EXPECT_THAT(r.output,
              HasSubstr("huawei.com/Ascend910B3: "
                        "[{\"UUID\":\"npu1-6\",\"temp\":\"vir05_1c_16g\",\"memory\":16384}]"));
  EXPECT_THAT(r.output, HasSubstr("predicate-time: 1765155600\n"));
  Result json = RunTessera(
      "explain --cluster test/testdata/cli/ascend-cluster.yaml --pod "
      "test/testdata/cli/ascend-pod.yaml --device-config "
      "test/testdata/cli/ascend-device-config.yaml --now 1765155600 -o json",
      false);
  ASSERT_EQ(json.exit_code, 0) << json.output;
  nlohmann::json doc = nlohmann::json::parse(json.output);
  EXPECT_EQ(doc["nodes"]["gpu-1"]["reasons"][0], "1/0 NodeInsufficientDevice");
  EXPECT_EQ(doc["webhook"].size(), 1U);
  // Without the device config the chip is unknown: NVIDIA's rules refuse the pod, naming it.
  Result plain = RunTessera(
      "explain --cluster test/testdata/cli/ascend-cluster.yaml --pod "
      "test/testdata/cli/ascend-pod.yaml");
  EXPECT_EQ(plain.exit_code, 2) << plain.output;
  EXPECT_THAT(plain.output, HasSubstr("Huawei Ascend"));
}

TEST(CliTest, ExplainAnAscendPodTheWebhookRefusesExitsOneWithHamisText) {
  Result r = RunTessera(
      "explain --cluster test/testdata/cli/ascend-cluster.yaml --pod "
      "test/testdata/cli/ascend-pod-refused.yaml --device-config "
      "test/testdata/cli/ascend-device-config.yaml");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the admission webhook refuses pod ml/infer-2: vNPU not "
                                  "supported for multiple devices"));
}

TEST(CliTest, ExplainNoFitExitsOneWithReasons) {
  Result r = RunTessera(
      "explain --cluster examples/cluster.yaml --pod test/testdata/cli/too-big.yaml -o json",
      false);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  nlohmann::json doc = nlohmann::json::parse(r.output);
  EXPECT_TRUE(doc["node"].is_null());
  EXPECT_THAT(doc["nodes"]["gpu-t4-1"]["reasons"][0].get<std::string>(),
              HasSubstr("CardInsufficientMemory"));
}

TEST(CliTest, ExplainBadInputExitsTwoNamingTheProblem) {
  Result r = RunTessera(
      "explain --cluster examples/cluster.yaml --pod test/testdata/cli/bad-request.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("pod ml/bad"));
  EXPECT_THAT(r.output, HasSubstr("nvidia.com/gpumem"));

  r = RunTessera(
      "explain --cluster examples/cluster.yaml --pod examples/pod.yaml --gpu-policy fastest");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--gpu-policy"));

  r = RunTessera("explain --cluster /nonexistent.yaml --pod examples/pod.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("/nonexistent.yaml"));

  r = RunTessera("explain --cluster examples/cluster.yaml --pod examples/cluster.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("expected exactly one Pod"));
}

TEST(CliTest, DecodeNodeRegisterPrintsHamiJsonKeys) {
  Result r = RunTessera(
      "decode node-register 'GPU-ebe7c3f7-303d-558d-435e-99a160631fe4,10,7680,100,"
      "NVIDIA-Tesla P4,0,true:'",
      false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json doc = nlohmann::json::parse(r.output);
  ASSERT_EQ(doc.size(), 1u);
  EXPECT_EQ(doc[0]["id"], "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4");
  EXPECT_EQ(doc[0]["index"], 0);
  EXPECT_EQ(doc[0]["count"], 10);
  EXPECT_EQ(doc[0]["devmem"], 7680);
  EXPECT_EQ(doc[0]["devcore"], 100);
  EXPECT_EQ(doc[0]["type"], "NVIDIA-Tesla P4");
  EXPECT_EQ(doc[0]["numa"], 0);
  EXPECT_EQ(doc[0]["mode"], "hami-core");
  EXPECT_EQ(doc[0]["health"], true);

  r = RunTessera(
      "decode node-register '[{\"id\":\"GPU-0\",\"count\":10,\"devmem\":8192,\"devcore\":100,"
      "\"type\":\"NVIDIA-A100\",\"health\":true,\"index\":3,\"mode\":\"mig\"}]'",
      false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  doc = nlohmann::json::parse(r.output);
  EXPECT_EQ(doc[0]["index"], 3);
  EXPECT_EQ(doc[0]["mode"], "mig");
}

TEST(CliTest, DecodePodDevicesPrintsOneArrayPerContainer) {
  Result r = RunTessera(
      "decode pod-devices 'GPU-a,NVIDIA,3000,30:;;GPU-b,NVIDIA,1000,10:GPU-c,NVIDIA,"
      "1000,10:;'",
      false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json doc = nlohmann::json::parse(r.output);
  ASSERT_EQ(doc.size(), 3u);
  EXPECT_EQ(
      doc[0][0],
      (nlohmann::json{{"uuid", "GPU-a"}, {"type", "NVIDIA"}, {"memMiB", 3000}, {"cores", 30}}));
  EXPECT_TRUE(doc[1].empty());
  EXPECT_EQ(doc[2].size(), 2u);
}

TEST(CliTest, DecodeMalformedExitsTwo) {
  Result r = RunTessera("decode pod-devices 'GPU-a,NVIDIA;'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("container 0"));
  r = RunTessera("decode node-register 'GPU-1,ten,1,1,T,0,true:'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("count"));
}

TEST(CliTest, HelpAndUsageErrors) {
  Result r = RunTessera("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("explain"));
  EXPECT_THAT(r.output, HasSubstr("decode"));
  r = RunTessera("explain --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--node-policy"));
  r = RunTessera("--no-such-flag");
  EXPECT_EQ(r.exit_code, 2);
  r = RunShell(std::string("KUBECONFIG=/nonexistent/kc '") + TESSERA_BINARY_PATH +
               "' explain --pod examples/pod.yaml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--cluster"));
}

// A mistyped command gets the nearest one, as kubectl and git suggest; exit 2 (usage).
TEST(CliTest, AnUnknownCommandSuggestsTheNearest) {
  for (const auto& [typed, meant] : {std::pair<std::string, std::string>{"serv", "serve"},
                                     {"expalin", "explain"},
                                     {"-v 2 decod", "decode"},
                                     {"verison", "version"}}) {
    Result r = RunTessera(typed);
    EXPECT_EQ(r.exit_code, 2) << typed << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr("unknown command \"" + typed.substr(typed.rfind(' ') + 1) +
                                    "\"; did you mean " + meant + "?"));
  }
  Result far = RunTessera("frobnicate");
  EXPECT_EQ(far.exit_code, 2) << far.output;
  EXPECT_THAT(far.output, HasSubstr("unknown command \"frobnicate\"\nRun 'tessera --help'"));
  Result flag = RunTessera("serve --no-such-flag");  // not a command: CLI11's own message
  EXPECT_EQ(flag.exit_code, 2) << flag.output;
  EXPECT_THAT(flag.output, Not(HasSubstr("did you mean")));
}

TEST(CliTest, LoggingFormatIsTextOrJson) {
  Result bad = RunTessera("--logging-format=xml version");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("--logging-format"));
  EXPECT_EQ(RunTessera("version --logging-format=json").exit_code, 0);
}

// `bench serve --json` at a small scale: one JSON object with every key the issue lists, a
// decision for every pair, and the passthrough floor measured in the same run. One client, so
// that no bind can find the node still locked by another client's pod (HAMi's lock, released
// only by the device plugin): the retries make such a failure rare, not impossible, and
// BenchServeRetriesARefusedBind is the test of them.
TEST(CliTest, BenchServeJsonCarriesEveryFigure) {
  Result r = RunTessera(
      "bench serve --nodes 20 --pods 100 --candidates 10 --clients 1 --duration 1500ms "
      "--baseline-calls 2 --resync-filters 20 --json",
      /*merge_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.output;
  for (const char* key :
       {"nodes", "gpus", "pods", "candidates", "filter_p50_ms", "filter_p99_ms", "pairs_per_second",
        "baseline_filter_p50_ms", "baseline_ratio", "rss_mib", "floor_p50_ms", "floor_p99_ms"}) {
    EXPECT_TRUE(j.contains(key) && j[key].is_number()) << key << " in " << r.output;
  }
  EXPECT_EQ(j.value("nodes", 0), 20);
  EXPECT_EQ(j.value("gpus", 0), 160);
  EXPECT_EQ(j.value("candidates", 0), 10);
  EXPECT_GT(j.value("filters", 0), 0);
  EXPECT_GT(j.value("pairs", 0), 0);
  EXPECT_EQ(j.value("pair_errors", -1), 0);
  EXPECT_GT(j.value("floor_calls", 0), 0);
  EXPECT_GT(j.value("floor_p50_ms", 0.0), 0.0);
  EXPECT_LE(j.value("floor_p50_ms", 0.0), j.value("floor_p99_ms", 0.0));
  EXPECT_EQ(j.value("resync_corrections", -1), 0);
  EXPECT_GT(j.value("pair_cpu_ms", 0.0), 0.0);
  EXPECT_GT(j.value("pair_context_switches", 0.0), 0.0);
}

// `bench serve` retries a pod whose bind the extender refused, as kube-scheduler requeues it.
// Four clients with binpack on 20 nodes converge on the same node, so binds meet each other's
// node lock: with three attempts per pod the retries are counted and most refused binds
// succeed on a later attempt; with one attempt nothing is retried and every refusal is an error.
TEST(CliTest, BenchServeRetriesARefusedBind) {
  auto run = [](int attempts) {
    Result r = RunTessera(
        "bench serve --nodes 20 --pods 100 --candidates 20 --clients 4 --node-policy binpack "
        "--duration 1500ms --baseline-calls 2 --resync-filters 0 --json --pair-attempts " +
            std::to_string(attempts),
        /*merge_stderr=*/false);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    nlohmann::json j = nlohmann::json::parse(r.output, nullptr, false);
    EXPECT_TRUE(j.is_object()) << r.output;
    return j.is_object() ? j : nlohmann::json::object();
  };
  const nlohmann::json retried = run(3);
  const nlohmann::json once = run(1);
  EXPECT_GT(retried.value("pairs", 0), 0);
  EXPECT_GT(retried.value("pair_retries", 0), 0);
  EXPECT_EQ(once.value("pair_retries", -1), 0);
  EXPECT_GT(once.value("pair_errors", 0), 0);
  EXPECT_LT(retried.value("pair_errors", 0), once.value("pair_errors", 0));
}

// `explain --kubeconfig` against `tessera apisim` holding the objects of examples/cluster.yaml
// (loaded with kubectl, as a user would).
class ExplainLiveTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (RunShell("kubectl version --client").exit_code != 0) {
      return;  // SetUp skips
    }
    char tmpl[] = "/tmp/tessera-explain-live-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    sim_ = new tessera::testing::ApisimProcess();
    url_ = new std::string();
    *url_ = sim_->Start(TESSERA_BINARY_PATH, {"--write-kubeconfig", Kubeconfig()});
    ASSERT_FALSE(url_->empty()) << "apisim did not start";
    const std::string kubectl = "kubectl --kubeconfig '" + Kubeconfig() + "' ";
    Result ns =
        RunShell("printf 'apiVersion: v1\\nkind: Namespace\\nmetadata:\\n  name: ml\\n' | " +
                 kubectl + "create --validate=false -f -");
    ASSERT_EQ(ns.exit_code, 0) << ns.output;
    Result objs = RunShell(kubectl + "create --validate=false -f examples/cluster.yaml");
    ASSERT_EQ(objs.exit_code, 0) << objs.output;
  }
  static void TearDownTestSuite() {
    delete sim_;
    sim_ = nullptr;
    delete url_;
    url_ = nullptr;
    if (dir_ != nullptr) {
      std::remove(Kubeconfig().c_str());
      rmdir(dir_->c_str());
      delete dir_;
      dir_ = nullptr;
    }
  }
  void SetUp() override {
    if (sim_ == nullptr) {
      GTEST_SKIP() << "kubectl is not installed";
    }
  }

  static std::string Kubeconfig() { return *dir_ + "/kubeconfig"; }
  static std::string Live(const std::string& args) {
    return "explain --kubeconfig '" + Kubeconfig() + "' --now 1764670500 " + args;
  }

  static inline std::string* dir_ = nullptr;
  static inline std::string* url_ = nullptr;
  static inline tessera::testing::ApisimProcess* sim_ = nullptr;
};

TEST_F(ExplainLiveTest, LiveClusterGivesTheSameDecisionAsTheManifest) {
  Result file = RunTessera(std::string(kExplain) + "-o json", false);
  ASSERT_EQ(file.exit_code, 0) << file.output;
  Result live = RunTessera(Live("--pod examples/pod.yaml -o json"), false);
  ASSERT_EQ(live.exit_code, 0) << live.output;
  nlohmann::json want = nlohmann::json::parse(file.output);
  nlohmann::json got = nlohmann::json::parse(live.output);
  ASSERT_TRUE(got["node"].is_string());
  EXPECT_EQ(got["node"], want["node"]);
  EXPECT_EQ(got["containers"], want["containers"]);
  EXPECT_EQ(got["annotations"], want["annotations"]);
  EXPECT_EQ(got["labels"], want["labels"]);
  // Every node with the same verdict, score and reasons (the Succeeded pod holds nothing, the
  // running ones hold their devices, in both sources).
  EXPECT_EQ(got["nodes"], want["nodes"]);
  EXPECT_EQ(got, want);

  Result text = RunTessera(Live("--pod examples/pod.yaml"));
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output,
              HasSubstr("pod ml/finetune-0 → node " + want["node"].get<std::string>()));
  EXPECT_THAT(text.output, HasSubstr("node unregistered"));
}

TEST_F(ExplainLiveTest, PodByNamespaceAndNameIsReadFromTheCluster) {
  // A running pod of the cluster, re-placed: it is left out of the cluster it is read from, so
  // its own devices are free again and the decision is that of the manifest run.
  Result file = RunTessera(
      "explain --cluster examples/cluster.yaml --pod test/testdata/cli/train-0.yaml --now "
      "1764670500 -o json",
      false);
  Result live = RunTessera(Live("--pod ml/train-0 -o json"), false);
  ASSERT_EQ(live.exit_code, 0) << live.output;
  nlohmann::json got = nlohmann::json::parse(live.output);
  EXPECT_EQ(got["pod"], "ml/train-0");
  ASSERT_EQ(file.exit_code, 0) << file.output;
  EXPECT_EQ(got, nlohmann::json::parse(file.output));

  Result missing = RunTessera(Live("--pod ml/nope"));
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr(*url_));
  EXPECT_THAT(missing.output, HasSubstr("not found"));

  Result neither = RunTessera(Live("--pod no-such-file.yaml"));
  EXPECT_EQ(neither.exit_code, 2) << neither.output;
  EXPECT_THAT(neither.output, HasSubstr("no-such-file.yaml"));
}

// As kubectl: the kubeconfig from $KUBECONFIG, the pod by name with -n (else the context's
// namespace), -o json | yaml | wide.
TEST_F(ExplainLiveTest, KubeconfigFromTheEnvironmentPodByNameAndOutputFormats) {
  const std::string env =
      "KUBECONFIG='" + Kubeconfig() + "' '" + TESSERA_BINARY_PATH + "' explain --now 1764670500 ";
  Result want = RunTessera(Live("--pod ml/train-0 -o json"), false);
  ASSERT_EQ(want.exit_code, 0) << want.output;
  Result by_name = RunShell(env + "train-0 -n ml -o json", false);
  ASSERT_EQ(by_name.exit_code, 0) << by_name.output;
  EXPECT_EQ(nlohmann::json::parse(by_name.output), nlohmann::json::parse(want.output));
  // -o yaml is the same document (read back by PyYAML).
  Result yaml = RunShell(env +
                             "ml/train-0 -o yaml | python3 -c 'import sys, json, yaml; "
                             "print(json.dumps(yaml.safe_load(sys.stdin)))'",
                         false);
  ASSERT_EQ(yaml.exit_code, 0) << yaml.output;
  EXPECT_EQ(nlohmann::json::parse(yaml.output), nlohmann::json::parse(want.output));
  // -o wide: the text report with each node's devices and their use.
  Result wide = RunShell(env + "train-0 -n ml -o wide");
  EXPECT_EQ(wide.exit_code, 0) << wide.output;
  EXPECT_THAT(wide.output, ::testing::ContainsRegex("NODE +FIT +SCORE +GPUS +SHARED +MEMORY MiB"));
  EXPECT_THAT(wide.output, ::testing::ContainsRegex("gpu-t4-1 .* 4 +[0-9]+ +[0-9]+/61440"));
  // Without -n, the context's namespace (apisim's kubeconfig names none: default).
  Result other_ns = RunShell(env + "train-0");
  EXPECT_EQ(other_ns.exit_code, 1) << other_ns.output;
  EXPECT_THAT(other_ns.output, HasSubstr("getting pod default/train-0"));
  Result clash = RunShell(env + "ml/train-0 -n default");
  EXPECT_EQ(clash.exit_code, 2) << clash.output;
  EXPECT_THAT(clash.output, HasSubstr("-n says default"));
}

// `kubectl tessera explain …`: kubectl finds the plugin kubectl-tessera on $PATH (a link to the
// binary) and runs it with the arguments after "tessera".
TEST_F(ExplainLiveTest, RunsAsTheKubectlPlugin) {
  const std::string bin = *dir_ + "/bin";
  ASSERT_EQ(RunShell("mkdir -p '" + bin + "' && ln -sf '" + TESSERA_BINARY_PATH + "' '" + bin +
                     "/kubectl-tessera'")
                .exit_code,
            0);
  const std::string kubectl =
      "PATH='" + bin + "':\"$PATH\" KUBECONFIG='" + Kubeconfig() + "' kubectl tessera ";
  Result want = RunTessera(Live("--pod ml/train-0 -o json"), false);
  ASSERT_EQ(want.exit_code, 0) << want.output;
  Result plugin = RunShell(kubectl + "explain train-0 -n ml --now 1764670500 -o json", false);
  ASSERT_EQ(plugin.exit_code, 0) << plugin.output;
  EXPECT_EQ(nlohmann::json::parse(plugin.output), nlohmann::json::parse(want.output));
  Result help = RunShell(kubectl + "--help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_THAT(help.output, HasSubstr("kubectl tessera"));
  Result typo = RunShell(kubectl + "explian");
  EXPECT_EQ(typo.exit_code, 2) << typo.output;
  EXPECT_THAT(typo.output, HasSubstr("did you mean explain?"));
  RunShell("rm -rf '" + bin + "'");
}

// The value of `name` in the environment of process `pid`; nullopt when it is not set.
std::optional<std::string> EnvironmentOf(pid_t pid, const std::string& name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string entry;
  while (std::getline(in, entry, '\0')) {
    if (entry.rfind(name + "=", 0) == 0) {
      return entry.substr(name.size() + 1);
    }
  }
  return std::nullopt;
}

// base/allocator.h: the binary runs with glibc's larger thread caches unless the operator set
// GLIBC_TUNABLES, which is then left exactly as given (empty included).
TEST(CliTest, RunsWithTwoAllocatorArenasAndGlibcsThreadCachesUnlessTheOperatorTunedThem) {
  // This process's own GLIBC_TUNABLES comes back however the test ends (an ASSERT returns early).
  struct RestoreOnExit {
    std::optional<std::string> value;
    ~RestoreOnExit() {
      if (value) {
        setenv("GLIBC_TUNABLES", value->c_str(), 1);
      } else {
        unsetenv("GLIBC_TUNABLES");
      }
    }
  };
  const char* saved = getenv("GLIBC_TUNABLES");
  const RestoreOnExit restore{saved != nullptr ? std::optional<std::string>(saved) : std::nullopt};
  struct Case {
    std::optional<std::string> given;
    std::string expected;
  };
  // Serve's own setting leaves glibc's thread caches at their default (7 chunks per size class):
  // larger ones made serve's memory grow with pod churn (docs/serve.md "The allocator").
  const Case cases[] = {{std::nullopt, "glibc.malloc.arena_max=2"},
                        {"glibc.malloc.tcache_count=7", "glibc.malloc.tcache_count=7"},
                        {"", ""}};
  for (const Case& c : cases) {
    if (c.given) {
      setenv("GLIBC_TUNABLES", c.given->c_str(), 1);
    } else {
      unsetenv("GLIBC_TUNABLES");
    }
    tessera::testing::ApisimProcess sim;
    const std::string url = sim.Start(TESSERA_BINARY_PATH);
    ASSERT_FALSE(url.empty()) << "apisim did not start";
    const std::string seen = EnvironmentOf(sim.pid(), "GLIBC_TUNABLES").value_or("(unset)");
    EXPECT_EQ(seen, c.expected) << "given " << c.given.value_or("(unset)");
    EXPECT_EQ(sim.Stop(), 0) << "apisim did not exit cleanly on SIGTERM";
  }
}

TEST(CliTest, ExplainWithWrongCredentialsExitsOneNamingTheServer) {
  char tmpl[] = "/tmp/tessera-explain-401-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  tessera::testing::ApisimProcess sim;
  const std::string url =
      sim.Start(TESSERA_BINARY_PATH, {"--token", "right", "--write-kubeconfig", dir + "/good"});
  ASSERT_FALSE(url.empty());
  {
    std::ofstream f(dir + "/bad");
    f << "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: s\n  cluster:\n"
      << "    server: " << url << "\nusers:\n- name: u\n  user:\n    token: wrong\n"
      << "contexts:\n- name: c\n  context:\n    cluster: s\n    user: u\n";
  }
  Result r = RunTessera("explain --kubeconfig '" + dir + "/bad' --pod examples/pod.yaml");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("API server " + url));
  EXPECT_THAT(r.output, HasSubstr("401"));
  // The right token gets through (an empty cluster: no node to fit, exit 1 with a decision).
  Result good =
      RunTessera("explain --kubeconfig '" + dir + "/good' --pod examples/pod.yaml -o json", false);
  EXPECT_EQ(good.exit_code, 1) << good.output;
  EXPECT_TRUE(nlohmann::json::parse(good.output)["node"].is_null());
  Result context =
      RunTessera("explain --kubeconfig '" + dir + "/bad' --context other --pod examples/pod.yaml");
  EXPECT_EQ(context.exit_code, 2) << context.output;
  EXPECT_THAT(context.output, HasSubstr("context other"));
  std::remove((dir + "/bad").c_str());
  std::remove((dir + "/good").c_str());
  rmdir(tmpl);
}

// One source: --cluster, or the live cluster of --kubeconfig / $KUBECONFIG / ~/.kube/config.
TEST(CliTest, ExplainReadsOneSource) {
  const std::string no_env =
      std::string("KUBECONFIG=/nonexistent/env-kc '") + TESSERA_BINARY_PATH + "' ";
  Result none = RunShell(no_env + "explain --pod examples/pod.yaml");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_THAT(none.output, HasSubstr("a live cluster needs a kubeconfig"));
  EXPECT_THAT(none.output, HasSubstr("/nonexistent/env-kc"));
  Result both = RunTessera(
      "explain --cluster examples/cluster.yaml --kubeconfig examples/cluster.yaml --pod "
      "examples/pod.yaml");
  EXPECT_EQ(both.exit_code, 2) << both.output;
  EXPECT_THAT(both.output, HasSubstr("not both"));
  Result context =
      RunTessera("explain --cluster examples/cluster.yaml --context x --pod examples/pod.yaml");
  EXPECT_EQ(context.exit_code, 2) << context.output;
  EXPECT_THAT(context.output, HasSubstr("not both"));
  Result by_name = RunTessera("explain --cluster examples/cluster.yaml --pod ml/train-0");
  EXPECT_EQ(by_name.exit_code, 2) << by_name.output;
  EXPECT_THAT(by_name.output, HasSubstr("needs a kubeconfig, not --cluster"));
  Result twice = RunTessera(
      "explain --cluster examples/cluster.yaml --pod examples/pod.yaml "
      "examples/pod.yaml");
  EXPECT_EQ(twice.exit_code, 2) << twice.output;
  EXPECT_THAT(twice.output, HasSubstr("name the pod once"));
  Result no_pod = RunTessera("explain --cluster examples/cluster.yaml");
  EXPECT_EQ(no_pod.exit_code, 2) << no_pod.output;
  EXPECT_THAT(no_pod.output, HasSubstr("name the pod once"));
  Result format = RunTessera(std::string(kExplain) + "-o toml");
  EXPECT_EQ(format.exit_code, 2) << format.output;
  Result no_kubeconfig = RunTessera("explain --kubeconfig /nonexistent/kc --pod examples/pod.yaml");
  EXPECT_EQ(no_kubeconfig.exit_code, 2) << no_kubeconfig.output;
  EXPECT_THAT(no_kubeconfig.output, HasSubstr("/nonexistent/kc"));
}

TEST(CliTest, ExplainAgainstAnUnreachableServerExitsOneNamingIt) {
  char tmpl[] = "/tmp/tessera-explain-down-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string kubeconfig = std::string(tmpl) + "/kubeconfig";
  tessera::testing::ApisimProcess sim;
  const std::string url = sim.Start(TESSERA_BINARY_PATH, {"--write-kubeconfig", kubeconfig});
  ASSERT_FALSE(url.empty());
  sim.Stop();  // the kubeconfig now names a port nobody listens on
  Result r = RunTessera("explain --kubeconfig '" + kubeconfig + "' --pod examples/pod.yaml");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("API server " + url));
  EXPECT_THAT(r.output, HasSubstr("listing nodes"));
  std::remove(kubeconfig.c_str());
  rmdir(tmpl);
}

// `tessera why` against `tessera apisim` holding one pending pod whose tessera.io/verdict its
// owner wrote: the annotation is a tenant's text.
class WhyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RunShell("curl --version").exit_code != 0) {
      GTEST_SKIP() << "curl is not installed";
    }
    char tmpl[] = "/tmp/tessera-why-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    url_ = sim_.Start(TESSERA_BINARY_PATH, {"--write-kubeconfig", dir_ + "/kubeconfig"});
    ASSERT_FALSE(url_.empty()) << "apisim did not start";
  }
  void TearDown() override {
    sim_.Stop();
    std::remove((dir_ + "/kubeconfig").c_str());
    std::remove((dir_ + "/pod.json").c_str());
    rmdir(dir_.c_str());
  }
  // Creates default/`name` carrying `verdict` (JSON text, escapes allowed) as its verdict.
  void CreatePod(const std::string& name, const std::string& verdict) {
    const nlohmann::json pod = {{"apiVersion", "v1"},
                                {"kind", "Pod"},
                                {"metadata",
                                 {{"name", name},
                                  {"namespace", "default"},
                                  {"annotations", {{"tessera.io/verdict", verdict}}}}},
                                {"spec", {{"containers", {{{"name", "c"}, {"image", "x"}}}}}}};
    {
      std::ofstream f(dir_ + "/pod.json");
      f << pod.dump();
    }
    Result r = RunShell(
        "curl -sS -o /dev/null -w '%{http_code}' -X POST -H "
        "'Content-Type: application/json' --data-binary @'" +
        dir_ + "/pod.json' " + url_ + "/api/v1/namespaces/default/pods");
    ASSERT_EQ(r.output, "201") << r.output;
  }
  std::string Why(const std::string& args) {
    return "why --kubeconfig '" + dir_ + "/kubeconfig' " + args;
  }

  tessera::testing::ApisimProcess sim_;
  std::string dir_;
  std::string url_;
};

// A verdict is printed as text, never as terminal commands: ESC, other controls, C1 and bidi
// overrides a tenant put in it come out as visible escapes, in the text and the JSON output.
TEST_F(WhyTest, AForgedVerdictsControlCharactersArePrintedEscaped) {
  CreatePod(
      "p",
      "{\"v\":1,\"reason\":\"CardInsufficientMemory\\u001b[2J\\u001b]0;pwned\\u0007\",\"nodes\":1,"
      "\"reasons\":[[\"CardInsufficientMemory\\n\\u009b2K\\u202e\",1]],"
      "\"quota\":\"ns ml\\r\\u001b[1A\"}");
  Result text = RunTessera(Why("default/p"), false);
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr("CardInsufficientMemory\\x1b[2J\\x1b]0;pwned\\x07"));
  EXPECT_THAT(text.output, HasSubstr("\\x0a\\u009b2K\\u202e"));
  EXPECT_THAT(text.output, HasSubstr("ns ml\\x0d\\x1b[1A"));
  for (char c : text.output) {
    const auto b = static_cast<unsigned char>(c);
    EXPECT_TRUE(b >= 0x20 || c == '\n' || c == '\t') << "control byte " << int(b) << " in:\n"
                                                     << text.output;
  }
  EXPECT_THAT(text.output, Not(HasSubstr("\xc2\x9b")));
  EXPECT_THAT(text.output, Not(HasSubstr("\xe2\x80\xae")));
  Result json = RunTessera(Why("default/p -o json"), false);
  EXPECT_EQ(json.exit_code, 0) << json.output;
  EXPECT_THAT(json.output, HasSubstr("\\u001b[2J"));
  EXPECT_THAT(json.output, HasSubstr("\\u202e"));
  for (char c : json.output) {
    const auto b = static_cast<unsigned char>(c);
    EXPECT_TRUE(b < 0x80 && (b >= 0x20 || c == '\n')) << "byte " << int(b) << " in JSON output";
  }
}

// --server names a listener that accepts connections and never answers: `why` gives up after
// --request-timeout with exit 1 and says so, instead of retrying for minutes.
TEST_F(WhyTest, ASilentServerFailsWithinTheRequestTimeout) {
  CreatePod("p", "{\"v\":1,\"reason\":\"CardInsufficientMemory\",\"nodes\":1}");
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);  // the kernel completes the handshakes; nothing ever answers
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string silent = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  const auto start = std::chrono::steady_clock::now();
  Result r = RunTessera(Why("default/p --server " + silent + " --request-timeout 1s"));
  const auto took = std::chrono::steady_clock::now() - start;
  close(fd);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--server " + silent));
  EXPECT_THAT(r.output, HasSubstr("no answer within 1s (--request-timeout)"));
  // A bound far above the 1 s asked, far below the default's 30 s and the 153 s of five retries.
  EXPECT_LT(took, std::chrono::seconds(15));
  // A timeout must be a positive duration, or 0 for none (as kubectl's).
  Result bad = RunTessera(Why("default/p --request-timeout soon"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("--request-timeout"));
}

}  // namespace

TEST(CliTest, ServeExplainsItsFlagsAndRefusesBadOnesWithExitTwo) {
  Result help = RunTessera("serve --help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* flag : {"--http_bind",
                           "--cert_file",
                           "--key_file",
                           "--metrics-bind-address",
                           "--scheduler-name",
                           "--self-username",
                           "--trusted-annotation-writers",
                           "--node-scheduler-policy",
                           "--gpu-scheduler-policy",
                           "--device-config-file",
                           "--node-label-selector",
                           "--node-lock-timeout",
                           "--node-lock-retry-timeout",
                           "--kube-qps",
                           "--kube-burst",
                           "--legacy-metrics",
                           "--kubeconfig",
                           "--reservation-ttl",
                           "--audit-period",
                           "--leader-elect",
                           "--leader-elect-mode",
                           "--leader-elect-resource-name",
                           "--leader-elect-resource-namespace",
                           "--leader-elect-identity",
                           "--leader-elect-lease-duration",
                           "--leader-elect-renew-deadline",
                           "--leader-elect-retry-period",
                           "--resync-period"}) {
    EXPECT_THAT(help.output, HasSubstr(flag));
  }
  Result mode = RunTessera("serve --leader-elect-mode=elect");
  EXPECT_EQ(mode.exit_code, 2);
  EXPECT_THAT(mode.output, HasSubstr("--leader-elect-mode"));
  Result contradiction = RunTessera("serve --leader-elect=false --leader-elect-mode=lease");
  EXPECT_EQ(contradiction.exit_code, 2);
  EXPECT_THAT(contradiction.output, HasSubstr("contradicts"));
  Result period = RunTessera("serve --leader-elect-retry-period=0s");
  EXPECT_EQ(period.exit_code, 2);
  EXPECT_THAT(period.output, HasSubstr("--leader-elect-retry-period"));
  Result deadline = RunTessera(
      "serve --leader-elect-mode=lease --leader-elect-renew-deadline=20s "
      "--kubeconfig /nonexistent/kubeconfig");
  EXPECT_EQ(deadline.exit_code, 2);
  EXPECT_THAT(deadline.output, HasSubstr("greater than --leader-elect-renew-deadline"));
  Result policy = RunTessera("serve --node-scheduler-policy bogus");
  EXPECT_EQ(policy.exit_code, 2);
  EXPECT_THAT(policy.output, HasSubstr("--node-scheduler-policy"));
  Result ttl = RunTessera("serve --reservation-ttl soon");
  EXPECT_EQ(ttl.exit_code, 2);
  EXPECT_THAT(ttl.output, HasSubstr("--reservation-ttl"));
  Result retry = RunTessera("serve --node-lock-retry-timeout=-1s");
  EXPECT_EQ(retry.exit_code, 2);
  EXPECT_THAT(retry.output, HasSubstr("--node-lock-retry-timeout"));
  // HAMi's chart sets HAMI_NODELOCK_EXPIRE; a value that is no duration is logged, not fatal
  // (the run then stops at the missing kubeconfig).
  Result env = RunShell(std::string("HAMI_NODELOCK_EXPIRE=soon '") + TESSERA_BINARY_PATH +
                        "' serve --kubeconfig /nonexistent/kubeconfig");
  EXPECT_EQ(env.exit_code, 2);
  EXPECT_THAT(env.output, HasSubstr("HAMI_NODELOCK_EXPIRE=\"soon\" is not a positive duration"));
  EXPECT_THAT(env.output, HasSubstr("/nonexistent/kubeconfig"));
  Result resync = RunTessera("serve --resync-period often");
  EXPECT_EQ(resync.exit_code, 2);
  EXPECT_THAT(resync.output, HasSubstr("--resync-period"));
  Result tls = RunTessera("serve --cert_file only.pem");
  EXPECT_EQ(tls.exit_code, 2);
  EXPECT_THAT(tls.output, HasSubstr("--key_file"));
  Result kubeconfig = RunTessera("serve --kubeconfig /nonexistent/kubeconfig");
  EXPECT_EQ(kubeconfig.exit_code, 2);
  EXPECT_THAT(kubeconfig.output, HasSubstr("/nonexistent/kubeconfig"));
  Result unknown = RunTessera("serve --no-such-flag");
  EXPECT_EQ(unknown.exit_code, 2);
}

// HAMi's chart runs the image as `scheduler <HAMi's flags>`: the program name selects serve, and
// pflag's syntax (-v=4 after the command, repeated flags, klog's flags) is accepted. Each run
// ends at the missing kubeconfig, after every flag was read.
TEST(CliTest, InvokedAsSchedulerItServesWithHamisFlagSyntax) {
  char tmpl[] = "/tmp/tessera-scheduler-name-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string scheduler = std::string(tmpl) + "/scheduler";
  ASSERT_EQ(symlink(TESSERA_BINARY_PATH, scheduler.c_str()), 0);
  Result help = RunShell("'" + scheduler + "' --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_THAT(help.output, HasSubstr("--http_bind"));
  EXPECT_THAT(help.output, HasSubstr("--enable-ascend"));
  Result run = RunShell("'" + scheduler +
                        "' --http_bind=127.0.0.1:0 --debug --enable-ascend=true --profiling "
                        "--kube-timeout=30 --default-mem=0 --cambricon-mlu-name=cambricon.com/mlu "
                        "--logtostderr --vmodule=filter=5 --log_file=/tmp/x.log -v=4 -v=2 "
                        "--kubeconfig /nonexistent/kubeconfig");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("/nonexistent/kubeconfig"));
  for (const char* notice :
       {"--debug=true", "--enable-ascend=true", "--profiling=true", "--kube-timeout=30",
        "--logtostderr=true", "--vmodule=filter=5", "--cambricon-mlu-name=cambricon.com/mlu"}) {
    EXPECT_THAT(run.output, HasSubstr(std::string("flag ") + notice + " accepted"));
  }
  EXPECT_THAT(run.output, HasSubstr("Ascend devices are not supported"));
  // The same binary under its own name keeps its commands.
  Result version = RunTessera("version");
  EXPECT_EQ(version.exit_code, 0);
  std::remove(scheduler.c_str());
  rmdir(tmpl);
}

TEST(CliTest, ARepeatedFlagTakesTheLastValueAsPflagDoes) {
  Result last_bad = RunTessera(
      "serve --node-scheduler-policy spread --node-scheduler-policy bogus "
      "--kubeconfig /nonexistent/kubeconfig");
  EXPECT_EQ(last_bad.exit_code, 2);
  EXPECT_THAT(last_bad.output, HasSubstr("--node-scheduler-policy"));
  Result last_good = RunTessera(
      "serve --node-scheduler-policy bogus --node-scheduler-policy=spread -v=3 -v=4 "
      "--kubeconfig /nonexistent/kubeconfig");
  EXPECT_EQ(last_good.exit_code, 2);
  EXPECT_THAT(last_good.output, Not(HasSubstr("--node-scheduler-policy:")));       // no error
  EXPECT_THAT(last_good.output, HasSubstr("--node-scheduler-policy=\"spread\""));  // start log
  EXPECT_THAT(last_good.output, HasSubstr("/nonexistent/kubeconfig"));
  Result bad_v = RunTessera("serve -v=x");
  EXPECT_EQ(bad_v.exit_code, 2);
}

// Like client-go and HAMi: $KUBECONFIG, when set and no --kubeconfig is given, wins over the
// in-cluster configuration.
TEST(CliTest, ServeReadsKubeconfigVariableEvenInAPod) {
  Result env = RunShell(std::string("KUBERNETES_SERVICE_HOST=10.96.0.1 KUBERNETES_SERVICE_PORT=443 "
                                    "KUBECONFIG=/nonexistent/from-env '") +
                        TESSERA_BINARY_PATH + "' serve");
  EXPECT_EQ(env.exit_code, 2) << env.output;
  EXPECT_THAT(env.output, HasSubstr("/nonexistent/from-env"));
  Result flag = RunShell(std::string("KUBECONFIG=/nonexistent/from-env '") + TESSERA_BINARY_PATH +
                         "' serve --kubeconfig /nonexistent/from-flag");
  EXPECT_EQ(flag.exit_code, 2) << flag.output;
  EXPECT_THAT(flag.output, HasSubstr("/nonexistent/from-flag"));
}
