#include "tessera/kube/config.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <stdlib.h>
#include <unistd.h>

#include "absl/strings/escaping.h"
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/base/logging.h"

namespace tessera::kube {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "s3cr3t-t0ken-value";
constexpr char kCaPem[] = "-----BEGIN CERTIFICATE-----\nQ0FDRVJU\n-----END CERTIFICATE-----\n";
constexpr char kCertPem[] = "-----BEGIN CERTIFICATE-----\nQ0xJRU5U\n-----END CERTIFICATE-----\n";
constexpr char kKeyPem[] = "-----BEGIN PRIVATE KEY-----\nUFJJVktFWQ==\n-----END PRIVATE KEY-----\n";

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tessera-config-XXXXXX").string();
    char* made = mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr);
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& content) const {
    const std::string full = path_ + "/" + name;
    std::filesystem::create_directories(std::filesystem::path(full).parent_path());
    std::ofstream(full, std::ios::binary | std::ios::trunc) << content;
    return full;
  }

 private:
  std::string path_;
};

GetenvFunc Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) {
      return std::nullopt;
    }
    return it->second;
  };
}

KubeconfigOptions Opts(std::string path, std::string context, GetenvFunc env) {
  KubeconfigOptions options;
  options.path = std::move(path);
  options.context = std::move(context);
  options.getenv = std::move(env);
  return options;
}

InClusterOptions InCluster(std::string dir, GetenvFunc env) {
  InClusterOptions options;
  options.service_account_dir = std::move(dir);
  options.getenv = std::move(env);
  return options;
}

std::string B64(const std::string& s) { return absl::Base64Escape(s); }

// Captures log lines for the lifetime of the object.
class LogCapture {
 public:
  LogCapture() {
    previous_ =
        SetLogSink([this](LogSeverity, std::string_view line) { lines_.emplace_back(line); });
  }
  ~LogCapture() { SetLogSink(previous_); }
  std::string All() const {
    std::string out;
    for (const std::string& l : lines_) {
      out += l + "\n";
    }
    return out;
  }

 private:
  LogSink previous_;
  std::vector<std::string> lines_;
};

TEST(LoadKubeconfig, ResolvesCurrentContextWithInlineData) {
  TempDir dir;
  const std::string file = dir.Write("config", R"(apiVersion: v1
kind: Config
current-context: prod
clusters:
- name: prod-cluster
  cluster:
    server: https://10.0.0.1:6443/
    certificate-authority-data: )" + B64(kCaPem) + R"(
    tls-server-name: kubernetes.default.svc
contexts:
- name: prod
  context: {cluster: prod-cluster, user: admin, namespace: gpu-jobs}
- name: other
  context: {cluster: prod-cluster, user: nobody}
users:
- name: admin
  user:
    token: )" + std::string(kToken) + R"(
    client-certificate-data: )" + B64(kCertPem) + R"(
    client-key-data: )" + B64(kKeyPem) + "\n");
  absl::StatusOr<RestConfig> config = LoadKubeconfig(Opts(file, "", Env({})));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.0.0.1:6443");
  EXPECT_EQ(config->ca_pem, kCaPem);
  EXPECT_EQ(config->tls_server_name, "kubernetes.default.svc");
  EXPECT_FALSE(config->insecure_skip_tls_verify);
  EXPECT_EQ(config->bearer_token, kToken);
  EXPECT_EQ(config->client_cert_pem, kCertPem);
  EXPECT_EQ(config->client_key_pem, kKeyPem);
  EXPECT_EQ(config->namespace_, "gpu-jobs");
  EXPECT_EQ(config->qps, 50);
  EXPECT_EQ(config->burst, 100);
  // DebugString says what is set without saying what it is.
  const std::string debug = config->DebugString();
  EXPECT_THAT(debug, HasSubstr("https://10.0.0.1:6443"));
  EXPECT_THAT(debug, HasSubstr("token=<set>"));
  EXPECT_THAT(debug, Not(HasSubstr(kToken)));
  EXPECT_THAT(debug, Not(HasSubstr("Q0xJRU5U")));
  EXPECT_THAT(debug, Not(HasSubstr("UFJJVktFWQ")));
}

TEST(LoadKubeconfig, ExplicitContextOverridesCurrent) {
  TempDir dir;
  const std::string file = dir.Write("config", R"(current-context: a
clusters:
- {name: ca, cluster: {server: "https://a:1"}}
- {name: cb, cluster: {server: "http://b:2", insecure-skip-tls-verify: true}}
contexts:
- {name: a, context: {cluster: ca}}
- {name: b, context: {cluster: cb}}
)");
  absl::StatusOr<RestConfig> config = LoadKubeconfig(Opts(file, "b", Env({})));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "http://b:2");
  EXPECT_TRUE(config->insecure_skip_tls_verify);
  EXPECT_EQ(config->namespace_, "default");
  EXPECT_TRUE(config->bearer_token.empty());
}

TEST(LoadKubeconfig, RelativePathsResolveAgainstTheKubeconfigDirectory) {
  TempDir dir;
  dir.Write("conf/pki/ca.crt", kCaPem);
  dir.Write("conf/pki/client.crt", kCertPem);
  dir.Write("conf/pki/client.key", kKeyPem);
  const std::string file = dir.Write("conf/kubeconfig", R"(current-context: c
clusters:
- {name: c, cluster: {server: "https://h:6443", certificate-authority: pki/ca.crt}}
users:
- {name: u, user: {client-certificate: pki/client.crt, client-key: pki/client.key,
                   tokenFile: pki/token}}
contexts:
- {name: c, context: {cluster: c, user: u}}
)");
  absl::StatusOr<RestConfig> config = LoadKubeconfig(Opts(file, "", Env({})));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ca_pem, kCaPem);
  EXPECT_EQ(config->client_cert_pem, kCertPem);
  EXPECT_EQ(config->client_key_pem, kKeyPem);
  EXPECT_EQ(config->token_file, dir.path() + "/conf/pki/token");
}

TEST(LoadKubeconfig, DataOverridesPath) {
  TempDir dir;
  const std::string file = dir.Write("config", R"(current-context: c
clusters:
- name: c
  cluster:
    server: https://h
    certificate-authority: /does/not/exist.crt
    certificate-authority-data: )" + B64(kCaPem) + R"(
contexts:
- {name: c, context: {cluster: c}}
)");
  absl::StatusOr<RestConfig> config = LoadKubeconfig(Opts(file, "", Env({})));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ca_pem, kCaPem);
}

TEST(LoadKubeconfig, MergesKubeconfigListFirstWins) {
  TempDir dir;
  const std::string first = dir.Write("one", R"(current-context: from-one
clusters:
- {name: shared, cluster: {server: "https://first:1"}}
contexts:
- {name: from-one, context: {cluster: shared, user: only-in-two}}
)");
  const std::string second = dir.Write("two", R"(current-context: from-two
clusters:
- {name: shared, cluster: {server: "https://second:2"}}
- {name: extra, cluster: {server: "https://extra:3"}}
users:
- {name: only-in-two, user: {token: tok-two}}
contexts:
- {name: from-two, context: {cluster: extra}}
- {name: from-one, context: {cluster: extra}}
)");
  const std::string missing = dir.path() + "/missing";
  const std::string list = missing + "::" + first + ":" + second;
  absl::StatusOr<RestConfig> config = LoadKubeconfig(Opts("", "", Env({{"KUBECONFIG", list}})));
  ASSERT_TRUE(config.ok()) << config.status();
  // current-context from the first file, its context from the first file, the cluster defined
  // by both files from the first, the user from the second.
  EXPECT_EQ(config->server, "https://first:1");
  EXPECT_EQ(config->bearer_token, "tok-two");
  EXPECT_THAT(config->source, HasSubstr("context from-one"));

  absl::StatusOr<RestConfig> two =
      LoadKubeconfig(Opts("", "from-two", Env({{"KUBECONFIG", list}})));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->server, "https://extra:3");
}

TEST(LoadKubeconfig, KubeconfigListWithNoExistingFileIsNotFound) {
  TempDir dir;
  absl::StatusOr<RestConfig> config =
      LoadKubeconfig(Opts("", "", Env({{"KUBECONFIG", dir.path() + "/a:" + dir.path() + "/b"}})));
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
}

TEST(LoadKubeconfig, FallsBackToHomeKubeConfig) {
  TempDir dir;
  dir.Write(".kube/config", R"(current-context: c
clusters: [{name: c, cluster: {server: "https://home:6443"}}]
contexts: [{name: c, context: {cluster: c}}]
)");
  absl::StatusOr<RestConfig> config = LoadKubeconfig(Opts("", "", Env({{"HOME", dir.path()}})));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://home:6443");

  TempDir empty;
  EXPECT_EQ(LoadKubeconfig(Opts("", "", Env({{"HOME", empty.path()}}))).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(LoadKubeconfig, ExplicitPathMustExist) {
  TempDir dir;
  absl::StatusOr<RestConfig> config = LoadKubeconfig(Opts(dir.path() + "/nope", "", Env({})));
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(config.status().message(), HasSubstr(dir.path() + "/nope"));
}

TEST(LoadKubeconfig, ExecAndAuthProviderAreUnsupportedAndNamed) {
  TempDir dir;
  const std::string file = dir.Write("config", R"(current-context: e
clusters: [{name: c, cluster: {server: "https://h"}}]
users:
- name: eks-user
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: aws
      args: [eks, get-token, --token, )" + std::string(kToken) +
                                                   R"(]
- name: gcp-user
  user:
    auth-provider: {name: gcp, config: {access-token: )" +
                                                   std::string(kToken) + R"(}}
contexts:
- {name: e, context: {cluster: c, user: eks-user}}
- {name: g, context: {cluster: c, user: gcp-user}}
)");
  absl::StatusOr<RestConfig> exec = LoadKubeconfig(Opts(file, "", Env({})));
  EXPECT_EQ(exec.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(exec.status().message(), HasSubstr("user eks-user"));
  EXPECT_THAT(exec.status().message(), HasSubstr("exec"));
  EXPECT_THAT(exec.status().message(), Not(HasSubstr(kToken)));

  absl::StatusOr<RestConfig> gcp = LoadKubeconfig(Opts(file, "g", Env({})));
  EXPECT_EQ(gcp.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(gcp.status().message(), HasSubstr("user gcp-user"));
  EXPECT_THAT(gcp.status().message(), HasSubstr("auth-provider"));
  EXPECT_THAT(gcp.status().message(), Not(HasSubstr(kToken)));
}

TEST(LoadKubeconfig, RejectsInvalidConfigurations) {
  TempDir dir;
  struct Case {
    std::string name;
    std::string yaml;
    absl::StatusCode code;
    std::string needle;
  };
  const std::string ctx = "\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n";
  const std::vector<Case> cases = {
      {"insecure-with-ca",
       "current-context: c\nclusters: [{name: c, cluster: {server: https://h, "
       "insecure-skip-tls-verify: true, certificate-authority-data: " +
           B64(kCaPem) + "}}]\nusers: [{name: u, user: {}}]" + ctx,
       absl::StatusCode::kInvalidArgument, "insecure-skip-tls-verify"},
      {"no-server",
       "current-context: c\nclusters: [{name: c, cluster: {}}]\nusers: [{name: u}]" + ctx,
       absl::StatusCode::kInvalidArgument, "has no server"},
      {"missing-context",
       "current-context: zz\nclusters: [{name: c, cluster: {server: https://h}}]" + ctx,
       absl::StatusCode::kNotFound, "context zz not found"},
      {"missing-user",
       "current-context: c\nclusters: [{name: c, cluster: {server: https://h}}]" + ctx,
       absl::StatusCode::kNotFound, "user u not found"},
      {"no-current-context", "clusters: []" + ctx, absl::StatusCode::kNotFound,
       "no current-context"},
      {"bad-base64",
       "current-context: c\nclusters: [{name: c, cluster: {server: https://h}}]\n"
       "users: [{name: u, user: {client-key-data: '" +
           std::string(kToken) + "!!'}}]" + ctx,
       absl::StatusCode::kInvalidArgument, "client-key-data is not valid base64"},
      {"cert-without-key",
       "current-context: c\nclusters: [{name: c, cluster: {server: https://h}}]\n"
       "users: [{name: u, user: {client-certificate-data: " +
           B64(kCertPem) + "}}]" + ctx,
       absl::StatusCode::kInvalidArgument, "client key"},
      {"basic-auth",
       "current-context: c\nclusters: [{name: c, cluster: {server: https://h}}]\n"
       "users: [{name: u, user: {username: admin, password: " +
           std::string(kToken) + "}}]" + ctx,
       absl::StatusCode::kUnimplemented, "basic authentication"},
      {"bad-yaml", "clusters: [unclosed", absl::StatusCode::kInvalidArgument, "invalid YAML"},
      {"clusters-not-a-list", "clusters: {a: b}", absl::StatusCode::kInvalidArgument,
       "clusters is not a list"},
      {"server-not-string",
       "current-context: c\nclusters: [{name: c, cluster: {server: [a]}}]\nusers: [{name: u}]" +
           ctx,
       absl::StatusCode::kInvalidArgument, "server is not a string"},
  };
  for (const Case& c : cases) {
    const std::string file = dir.Write(c.name, c.yaml);
    absl::StatusOr<RestConfig> config = LoadKubeconfig(Opts(file, "", Env({})));
    EXPECT_EQ(config.status().code(), c.code) << c.name << ": " << config.status();
    EXPECT_THAT(config.status().message(), HasSubstr(c.needle)) << c.name;
    EXPECT_THAT(config.status().message(), HasSubstr(file)) << c.name;
    EXPECT_THAT(config.status().message(), Not(HasSubstr(kToken))) << c.name;
  }
}

TEST(LoadKubeconfig, WarningsNeverContainSecrets) {
  TempDir dir;
  const std::string file = dir.Write("config", R"(current-context: c
clusters: [{name: c, cluster: {server: "https://h"}}]
users:
- name: u
  user:
    client-certificate: cert.pem
    client-certificate-data: )" + B64(kCertPem) + R"(
    client-key-data: )" + B64(kKeyPem) + R"(
    token: )" + kToken + R"(
contexts: [{name: c, context: {cluster: c, user: u}}]
)");
  LogCapture capture;
  absl::StatusOr<RestConfig> config = LoadKubeconfig(Opts(file, "", Env({})));
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string logs = capture.All();
  EXPECT_THAT(logs, HasSubstr("client-certificate-data"));  // the warning was written
  EXPECT_THAT(logs, Not(HasSubstr(kToken)));
  EXPECT_THAT(logs, Not(HasSubstr("Q0xJRU5U")));
  EXPECT_THAT(logs, Not(HasSubstr(B64(kCertPem))));
}

TEST(ParseKubeconfig, ResolvesBytesAndReadsReferencedFilesThroughTheReader) {
  std::vector<std::string> asked;
  KubeconfigOptions options;
  options.context = "b";
  options.read_file = [&asked](const std::string& path) -> absl::StatusOr<std::string> {
    asked.push_back(path);
    if (path == "/etc/kube/ca.pem") {
      return std::string(kCaPem);
    }
    return absl::NotFoundError(path + ": no such file");
  };
  const std::string yaml = R"(current-context: a
clusters:
- {name: c, cluster: {server: "https://h:6443/", certificate-authority: ca.pem}}
users: [{name: u, user: {token: )" +
                           std::string(kToken) + R"(}}]
contexts:
- {name: a, context: {cluster: missing}}
- {name: b, context: {cluster: c, user: u, namespace: ns}}
)";
  absl::StatusOr<RestConfig> config = ParseKubeconfig(yaml, "/etc/kube/config", options);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://h:6443");
  EXPECT_EQ(config->ca_pem, kCaPem);
  EXPECT_EQ(config->bearer_token, kToken);
  EXPECT_EQ(config->namespace_, "ns");
  EXPECT_THAT(asked, ::testing::ElementsAre("/etc/kube/ca.pem"));

  // A referenced file the reader cannot serve is that reader's error, naming the field.
  options.read_file = [](const std::string& path) -> absl::StatusOr<std::string> {
    return absl::NotFoundError(path + ": no such file");
  };
  config = ParseKubeconfig(yaml, "/etc/kube/config", options);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(config.status().message(), HasSubstr("certificate-authority"));
}

TEST(ParseKubeconfig, MalformedBytesGiveAnErrorNotAHang) {
  // `"",` makes yaml-cpp 0.7's LoadAll emit empty documents forever; the kubeconfig parser
  // reads one document only. The others are truncated or odd inputs of the same family.
  const std::vector<std::string> inputs = {
      "\"\",",
      "- \"\",",
      "a: \"\",",
      "[",
      "{",
      "&a [*a]",
      "clusters: &a [*a]",
      "current-context: c\ncontexts: [{name: c, context: &x {cluster: *x}}]",
      std::string(5000, '['),
      "\xff\xfe\x00",
      "---\n---\n---\n",
  };
  for (const std::string& input : inputs) {
    absl::StatusOr<RestConfig> config = ParseKubeconfig(input, "fuzz.yaml");
    EXPECT_FALSE(config.ok()) << input;
    EXPECT_FALSE(config.status().message().empty()) << input;
  }
}

TEST(InClusterConfig, ReadsServiceAccountMount) {
  TempDir dir;
  dir.Write("token", std::string(kToken) + "\n");
  dir.Write("ca.crt", kCaPem);
  dir.Write("namespace", "  tessera-system\n");
  absl::StatusOr<RestConfig> config = InClusterConfig(InCluster(
      dir.path(),
      Env({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}})));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.96.0.1:443");
  EXPECT_EQ(config->token_file, dir.path() + "/token");
  EXPECT_TRUE(config->bearer_token.empty());
  EXPECT_EQ(config->ca_pem, kCaPem);
  EXPECT_EQ(config->namespace_, "tessera-system");
  EXPECT_FALSE(config->insecure_skip_tls_verify);
}

TEST(InClusterConfig, BracketsIpv6AndPrefersPodNamespace) {
  TempDir dir;
  dir.Write("token", kToken);
  dir.Write("namespace", "from-file");
  absl::StatusOr<RestConfig> config =
      InClusterConfig(InCluster(dir.path(), Env({{"KUBERNETES_SERVICE_HOST", "fd00::1"},
                                                 {"KUBERNETES_SERVICE_PORT", "6443"},
                                                 {"POD_NAMESPACE", "from-env"}})));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://[fd00::1]:6443");
  EXPECT_EQ(config->namespace_, "from-env");
  EXPECT_TRUE(config->ca_pem.empty());  // no ca.crt: system roots
}

TEST(InClusterConfig, NotInClusterAndMissingToken) {
  TempDir dir;
  absl::StatusOr<RestConfig> outside =
      InClusterConfig(InCluster(dir.path(), Env({{"KUBERNETES_SERVICE_HOST", "h"}})));
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(outside.status().message(), HasSubstr("not running in a cluster"));

  absl::StatusOr<RestConfig> no_token = InClusterConfig(InCluster(
      dir.path(), Env({{"KUBERNETES_SERVICE_HOST", "h"}, {"KUBERNETES_SERVICE_PORT", "1"}})));
  EXPECT_EQ(no_token.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_token.status().message(), HasSubstr(dir.path() + "/token"));
}

TEST(LoadRestConfig, KubeconfigVariableWinsOverInClusterButNotOverTheFlag) {
  TempDir sa;
  sa.Write("token", kToken);
  TempDir dir;
  const std::string env_file = dir.Write("env", R"(current-context: c
clusters: [{name: c, cluster: {server: "https://from-env:6443"}}]
contexts: [{name: c, context: {cluster: c}}]
)");
  const std::string flag_file = dir.Write("flag", R"(current-context: c
clusters: [{name: c, cluster: {server: "https://from-flag:6443"}}]
contexts: [{name: c, context: {cluster: c}}]
)");
  GetenvFunc env = Env({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                        {"KUBERNETES_SERVICE_PORT", "443"},
                        {"KUBECONFIG", env_file}});
  absl::StatusOr<RestConfig> from_env =
      LoadRestConfig(Opts("", "", env), InCluster(sa.path(), env));
  ASSERT_TRUE(from_env.ok()) << from_env.status();
  EXPECT_EQ(from_env->server, "https://from-env:6443");
  absl::StatusOr<RestConfig> from_flag =
      LoadRestConfig(Opts(flag_file, "", env), InCluster(sa.path(), env));
  ASSERT_TRUE(from_flag.ok()) << from_flag.status();
  EXPECT_EQ(from_flag->server, "https://from-flag:6443");
  // Set but empty counts as unset: in-cluster.
  GetenvFunc empty = Env({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                          {"KUBERNETES_SERVICE_PORT", "443"},
                          {"KUBECONFIG", ""}});
  absl::StatusOr<RestConfig> pod = LoadRestConfig(Opts("", "", empty), InCluster(sa.path(), empty));
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->source, "in-cluster");
}

TEST(LoadRestConfig, ChoosesFlagThenInClusterThenDefaults) {
  TempDir sa;
  sa.Write("token", kToken);
  TempDir home;
  const std::string kubeconfig = home.Write(".kube/config", R"(current-context: c
clusters: [{name: c, cluster: {server: "https://from-kubeconfig:6443"}}]
contexts: [{name: c, context: {cluster: c}}]
)");
  GetenvFunc cluster_env = Env({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                                {"KUBERNETES_SERVICE_PORT", "443"},
                                {"HOME", home.path()}});
  absl::StatusOr<RestConfig> flag =
      LoadRestConfig(Opts(kubeconfig, "", cluster_env), InCluster(sa.path(), cluster_env));
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->server, "https://from-kubeconfig:6443");

  absl::StatusOr<RestConfig> pod =
      LoadRestConfig(Opts("", "", cluster_env), InCluster(sa.path(), cluster_env));
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->server, "https://10.96.0.1:443");
  EXPECT_EQ(pod->source, "in-cluster");

  GetenvFunc laptop = Env({{"HOME", home.path()}});
  absl::StatusOr<RestConfig> dev =
      LoadRestConfig(Opts("", "", laptop), InCluster(sa.path(), laptop));
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ(dev->server, "https://from-kubeconfig:6443");
}

TEST(FileTokenSource, RereadsAfterThePeriod) {
  TempDir dir;
  const std::string path = dir.Write("token", "first\n");
  FakeClock clock;
  FileTokenSource source(path, &clock);
  EXPECT_EQ(*source.Token(), "first");
  dir.Write("token", "second");
  clock.Advance(absl::Seconds(59));
  EXPECT_EQ(*source.Token(), "first");  // cached within the minute
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(*source.Token(), "second");  // rotated token picked up at one minute
}

TEST(FileTokenSource, KeepsThePreviousTokenWhenTheFileVanishes) {
  TempDir dir;
  const std::string path = dir.Write("token", "good");
  FakeClock clock;
  FileTokenSource source(path, &clock);
  EXPECT_EQ(*source.Token(), "good");
  std::filesystem::remove(path);
  clock.Advance(absl::Minutes(2));
  LogCapture capture;
  EXPECT_EQ(*source.Token(), "good");
  EXPECT_THAT(capture.All(), HasSubstr(path));
  EXPECT_THAT(capture.All(), Not(HasSubstr("good")));
  dir.Write("token", "new");
  clock.Advance(absl::Minutes(1));
  EXPECT_EQ(*source.Token(), "new");
}

TEST(FileTokenSource, FallbackAndErrorWhenNeverRead) {
  TempDir dir;
  FakeClock clock;
  FileTokenSource with_fallback(dir.path() + "/none", &clock, absl::Minutes(1), "static");
  EXPECT_EQ(*with_fallback.Token(), "static");
  FileTokenSource without(dir.path() + "/none", &clock);
  EXPECT_EQ(without.Token().status().code(), absl::StatusCode::kNotFound);
}

TEST(MakeTokenSource, PrefersTheFile) {
  TempDir dir;
  FakeClock clock;
  RestConfig config;
  EXPECT_EQ(MakeTokenSource(config, &clock), nullptr);
  config.bearer_token = "static";
  EXPECT_EQ(*MakeTokenSource(config, &clock)->Token(), "static");
  config.token_file = dir.Write("token", "from-file");
  EXPECT_EQ(*MakeTokenSource(config, &clock)->Token(), "from-file");
}

}  // namespace
}  // namespace tessera::kube
