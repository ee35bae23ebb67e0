// File: tessera/kube/config.h
//
// How Tessera finds and authenticates to a Kubernetes API server.
//
//   RestConfig is the resolved connection: server URL, TLS material (PEM bytes in memory, never
//   paths), credentials and client-side limits. It is produced by
//     - LoadKubeconfig(): --kubeconfig, else $KUBECONFIG (':'-separated files merged the way
//       kubectl merges them), else $HOME/.kube/config; the current or an explicit context;
//     - InClusterConfig(): the service-account mount and $KUBERNETES_SERVICE_HOST/PORT.
//   TokenSource hands out the bearer token to send. FileTokenSource re-reads a token file at
//   least every `period` (one minute by default) because projected service-account tokens rotate.
//
// Secrets: no token, private key or certificate content ever appears in a log line, an error
// message or DebugString(); errors name files, fields, users and contexts only.
//
// Unsupported on purpose (each gives kUnimplemented naming the user): `exec` credential plugins,
// `auth-provider`, basic auth (username/password) and impersonation (`as*`).
//
// Thread safety: RestConfig is a value type. LoadKubeconfig/InClusterConfig are safe to call
// concurrently (they only read files and the environment). TokenSource implementations are safe
// for concurrent use.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"

namespace tessera::kube {

struct RestConfig {
  // "https://host:port" (optionally with a path prefix), no trailing slash.
  std::string server;
  // PEM bundle of trusted CAs; empty means the system trust store.
  std::string ca_pem;
  // Disables verification of the server certificate. Never on unless configured.
  bool insecure_skip_tls_verify = false;
  // Name to verify the server certificate against (and send as SNI) instead of the URL's host.
  std::string tls_server_name;
  // Client certificate and key, PEM. Both or neither.
  std::string client_cert_pem;
  std::string client_key_pem;
  // A static bearer token. When token_file is set too, the file wins (as in client-go) and this
  // is only used while the file cannot be read.
  std::string bearer_token;
  // A file holding the bearer token, re-read periodically (see FileTokenSource).
  std::string token_file;
  // The context's namespace ("default" when the context names none).
  std::string namespace_ = "default";
  // kubeconfig `disable-compression`: do not ask for gzip.
  bool disable_compression = false;

  // Client-side rate limit for requests (token bucket). qps <= 0 disables the limiter.
  double qps = 50;
  int burst = 100;
  // Time allowed to establish a connection (TCP + TLS).
  absl::Duration connect_timeout = absl::Seconds(10);
  // Default total time for a non-streaming request whose Request::timeout is zero.
  absl::Duration request_timeout = absl::Seconds(60);

  // Where this came from, for messages: "kubeconfig /path (context c)", "in-cluster".
  std::string source;

  // A one-line description with every secret redacted (e.g. "token: <set>").
  std::string DebugString() const;
};

// Reads an environment variable; returns nullopt when unset. Injectable for tests.
using GetenvFunc = std::function<std::optional<std::string>(const std::string& name)>;
// The process environment.
std::optional<std::string> ProcessGetenv(const std::string& name);

// Reads a whole file (ReadFileToString below by default). Injectable for tests and fuzzing.
using ReadFileFunc = std::function<absl::StatusOr<std::string>(const std::string& path)>;

struct KubeconfigOptions {
  // --kubeconfig. When set, only this file is read and it must exist.
  std::string path;
  // --context. Empty: the kubeconfig's current-context.
  std::string context;
  GetenvFunc getenv = ProcessGetenv;
  // Reads the kubeconfig files and the files they reference (certificate-authority,
  // client-certificate, client-key). Null: ReadFileToString.
  ReadFileFunc read_file;
};

// Loads and resolves a kubeconfig.
//
// File selection: `options.path`; else every entry of $KUBECONFIG (':'-separated; empty entries
// and missing files skipped, at least one must exist); else $HOME/.kube/config.
// Merging (kubectl rules): the first file that sets current-context wins; clusters, users and
// contexts are merged by name and the first file that defines a name wins. Relative paths
// (certificate-authority, client-certificate, client-key, tokenFile) are resolved against the
// directory of the file that defined the entry. `*-data` (base64) overrides the path variant.
//
// Errors: kNotFound (no file, context, cluster or user of that name); kInvalidArgument (bad YAML,
// bad base64, a missing server, a CA together with insecure-skip-tls-verify, a certificate
// without a key); kUnimplemented (exec, auth-provider, basic auth, impersonation); the error of
// reading a referenced file. Messages name the file/context/user, never secret content.
absl::StatusOr<RestConfig> LoadKubeconfig(const KubeconfigOptions& options);

// The decoder core of LoadKubeconfig: resolves `content`, the bytes of one kubeconfig, as if it
// were the only file and were called `file_name` (relative paths in it resolve against the
// directory of `file_name`; messages name it). Uses `options.context` and `options.read_file`
// (for referenced files); `options.path` and `options.getenv` are ignored. Only the first YAML
// document counts. Any bytes give a RestConfig or one of LoadKubeconfig's errors: never a
// crash, an exception or a hang.
absl::StatusOr<RestConfig> ParseKubeconfig(std::string_view content, const std::string& file_name,
                                           const KubeconfigOptions& options = {});

struct InClusterOptions {
  std::string service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
  GetenvFunc getenv = ProcessGetenv;
};

// The configuration of a pod's service account: server https://$KUBERNETES_SERVICE_HOST:
// $KUBERNETES_SERVICE_PORT (IPv6 bracketed), token_file <dir>/token (must be readable now),
// ca_pem from <dir>/ca.crt (if it cannot be read: logged, system roots used), namespace from
// $POD_NAMESPACE, else <dir>/namespace (trimmed), else "default".
// Errors: kFailedPrecondition when either environment variable is missing ("not running in a
// cluster"); the read error of the token file.
absl::StatusOr<RestConfig> InClusterConfig(const InClusterOptions& options = {});

// The configuration a server process uses, in controller-runtime's order (HAMi's and most kube
// components'): the kubeconfig named by `kubeconfig.path` when set; else $KUBECONFIG's files
// when that is set and not empty; else the in-cluster configuration when
// KUBERNETES_SERVICE_HOST/PORT are set; else $HOME/.kube/config. `kubeconfig.context` applies to
// the kubeconfig cases. Errors are those of the source chosen.
absl::StatusOr<RestConfig> LoadRestConfig(const KubeconfigOptions& kubeconfig,
                                          const InClusterOptions& in_cluster = {});

// Supplies the bearer token for each request.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // The token to send now. Errors are those of reading the underlying file.
  virtual absl::StatusOr<std::string> Token() = 0;
};

class StaticTokenSource : public TokenSource {
 public:
  explicit StaticTokenSource(std::string token) : token_(std::move(token)) {}
  absl::StatusOr<std::string> Token() override { return token_; }

 private:
  const std::string token_;
};

// Reads `path` on first use and again whenever `period` has passed on `clock` since the last
// successful read. Surrounding whitespace is trimmed. If a re-read fails (or yields an empty
// file) the previous token keeps being served and a warning naming the file is logged; if there
// never was a token, `fallback` is served when non-empty, else the read error is returned.
class FileTokenSource : public TokenSource {
 public:
  FileTokenSource(std::string path, Clock* clock, absl::Duration period = absl::Minutes(1),
                  std::string fallback = "");
  absl::StatusOr<std::string> Token() override;

 private:
  const std::string path_;
  Clock* const clock_;
  const absl::Duration period_;
  const std::string fallback_;
  Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> last_read_ ABSL_GUARDED_BY(mu_);
};

// The token source a config calls for: a FileTokenSource for token_file (with bearer_token as
// fallback), a StaticTokenSource for bearer_token, nullptr when the config has no token.
std::shared_ptr<TokenSource> MakeTokenSource(const RestConfig& config, Clock* clock);

// Reads a whole file. Errors (kNotFound, kPermissionDenied, kInternal) name the path only.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace tessera::kube
