#include "tessera/kube/config.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include <fmt/core.h>
#include <yaml-cpp/yaml.h>

#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"

namespace tessera::kube {
namespace {

constexpr const char kHomeKubeconfig[] = ".kube/config";

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) {
    return ".";
  }
  if (slash == 0) {
    return "/";
  }
  return path.substr(0, slash);
}

std::string ResolvePath(const std::string& dir, const std::string& path) {
  if (path.empty() || path[0] == '/') {
    return path;
  }
  if (dir == "/") {
    return "/" + path;
  }
  return dir + "/" + path;
}

bool FileExists(const std::string& path) {
  std::ifstream in(path);
  return in.good();
}

// One named entry (cluster, user or context) and the file that defined it.
struct Entry {
  YAML::Node node;
  std::string file;
  std::string dir;
};

struct Merged {
  std::string current_context;
  std::map<std::string, Entry> clusters;
  std::map<std::string, Entry> users;
  std::map<std::string, Entry> contexts;
  std::vector<std::string> files;
};

// Reads a scalar field. Absent or null gives "". A non-scalar is an error.
absl::StatusOr<std::string> Scalar(const YAML::Node& node, const char* key,
                                   const std::string& where) {
  const YAML::Node& value = node[key];
  if (!value.IsDefined() || value.IsNull()) {
    return std::string();
  }
  if (!value.IsScalar()) {
    return absl::InvalidArgumentError(fmt::format("{}: field {} is not a string", where, key));
  }
  return value.Scalar();
}

absl::StatusOr<bool> Bool(const YAML::Node& node, const char* key, const std::string& where) {
  const YAML::Node& value = node[key];
  if (!value.IsDefined() || value.IsNull()) {
    return false;
  }
  bool out = false;
  if (!value.IsScalar() || !YAML::convert<bool>::decode(value, out)) {
    return absl::InvalidArgumentError(fmt::format("{}: field {} is not a boolean", where, key));
  }
  return out;
}

bool Present(const YAML::Node& node, const char* key) {
  const YAML::Node& value = node[key];
  return value.IsDefined() && !value.IsNull();
}

// Merges the named list `key` (clusters/users/contexts) of one file: first definition wins.
absl::Status MergeList(const YAML::Node& root, const char* key, const char* inner,
                       const std::string& file, std::map<std::string, Entry>* out) {
  const YAML::Node& list = root[key];
  if (!list.IsDefined() || list.IsNull()) {
    return absl::OkStatus();
  }
  if (!list.IsSequence()) {
    return absl::InvalidArgumentError(fmt::format("kubeconfig {}: {} is not a list", file, key));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node& item = list[i];
    const std::string where = fmt::format("kubeconfig {}: {}[{}]", file, key, i);
    if (!item.IsMap()) {
      return absl::InvalidArgumentError(fmt::format("{} is not a map", where));
    }
    TESSERA_ASSIGN_OR_RETURN(std::string name, Scalar(item, "name", where));
    if (name.empty()) {
      return absl::InvalidArgumentError(fmt::format("{} has no name", where));
    }
    const YAML::Node& body = item[inner];
    if (body.IsDefined() && !body.IsNull() && !body.IsMap()) {
      return absl::InvalidArgumentError(
          fmt::format("{} ({}): {} is not a map", where, name, inner));
    }
    if (out->count(name) == 0) {
      out->emplace(name, Entry{body.IsDefined() ? body : YAML::Node(YAML::NodeType::Map), file,
                               DirName(file)});
    }
  }
  return absl::OkStatus();
}

// Merges one file's bytes. YAML::Load parses the first document only (one HandleNextDocument
// call), so it cannot fall into yaml-cpp 0.7's LoadAll loop of empty documents on inputs like
// `"",`; yaml-cpp bounds the nesting depth itself.
absl::Status MergeContent(std::string_view content, const std::string& file, Merged* merged) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(content));
  } catch (const YAML::Exception& e) {
    // The mark gives line and column; yaml-cpp's messages describe syntax, not content.
    return absl::InvalidArgumentError(
        fmt::format("kubeconfig {}: invalid YAML at line {}: {}", file, e.mark.line + 1, e.msg));
  }
  merged->files.push_back(file);
  if (root.IsNull()) {
    return absl::OkStatus();  // An empty file is an empty config.
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(fmt::format("kubeconfig {}: top level is not a map", file));
  }
  TESSERA_ASSIGN_OR_RETURN(std::string current,
                           Scalar(root, "current-context", "kubeconfig " + file));
  if (merged->current_context.empty()) {
    merged->current_context = current;
  }
  TESSERA_RETURN_IF_ERROR(MergeList(root, "clusters", "cluster", file, &merged->clusters));
  TESSERA_RETURN_IF_ERROR(MergeList(root, "users", "user", file, &merged->users));
  TESSERA_RETURN_IF_ERROR(MergeList(root, "contexts", "context", file, &merged->contexts));
  return absl::OkStatus();
}

absl::Status MergeFile(const std::string& file, const ReadFileFunc& read, Merged* merged) {
  TESSERA_ASSIGN_OR_RETURN(std::string content, read(file));
  return MergeContent(content, file, merged);
}

absl::StatusOr<std::string> DecodeBase64(const std::string& encoded, const std::string& where,
                                         const char* key) {
  std::string compact;
  compact.reserve(encoded.size());
  for (char c : encoded) {
    if (!absl::ascii_isspace(static_cast<unsigned char>(c))) {
      compact.push_back(c);
    }
  }
  std::string out;
  if (!absl::Base64Unescape(compact, &out)) {
    return absl::InvalidArgumentError(fmt::format("{}: {} is not valid base64", where, key));
  }
  return out;
}

// Reads `data_key` (base64) or else `path_key` (a file, relative to the entry's file).
absl::StatusOr<std::string> DataOrFile(const Entry& entry, const char* data_key,
                                       const char* path_key, const std::string& where,
                                       const ReadFileFunc& read) {
  TESSERA_ASSIGN_OR_RETURN(std::string data, Scalar(entry.node, data_key, where));
  TESSERA_ASSIGN_OR_RETURN(std::string path, Scalar(entry.node, path_key, where));
  if (!data.empty()) {
    if (!path.empty()) {
      TESSERA_LOG(kWarning, "{}: both {} and {} are set; using {}", where, data_key, path_key,
                  data_key);
    }
    return DecodeBase64(data, where, data_key);
  }
  if (path.empty()) {
    return std::string();
  }
  const std::string resolved = ResolvePath(entry.dir, path);
  absl::StatusOr<std::string> content = read(resolved);
  if (!content.ok()) {
    return Annotate(content.status(), fmt::format("{}: {}", where, path_key));
  }
  return content;
}

std::string NormalizeServer(std::string server) {
  while (!server.empty() && server.back() == '/') {
    server.pop_back();
  }
  if (server.find("://") == std::string::npos) {
    server = "https://" + server;
  }
  return server;
}

absl::Status ResolveCluster(const Entry& entry, const std::string& name, const ReadFileFunc& read,
                            RestConfig* config) {
  const std::string where = fmt::format("kubeconfig {}: cluster {}", entry.file, name);
  TESSERA_ASSIGN_OR_RETURN(std::string server, Scalar(entry.node, "server", where));
  if (server.empty()) {
    return absl::InvalidArgumentError(fmt::format("{} has no server", where));
  }
  config->server = NormalizeServer(server);
  if (config->server.rfind("https://", 0) != 0 && config->server.rfind("http://", 0) != 0) {
    return absl::InvalidArgumentError(
        fmt::format("{}: server {} is neither http:// nor https://", where, config->server));
  }
  TESSERA_ASSIGN_OR_RETURN(config->ca_pem, DataOrFile(entry, "certificate-authority-data",
                                                      "certificate-authority", where, read));
  TESSERA_ASSIGN_OR_RETURN(config->insecure_skip_tls_verify,
                           Bool(entry.node, "insecure-skip-tls-verify", where));
  if (config->insecure_skip_tls_verify && !config->ca_pem.empty()) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: a certificate authority together with insecure-skip-tls-verify is not allowed",
        where));
  }
  TESSERA_ASSIGN_OR_RETURN(config->tls_server_name, Scalar(entry.node, "tls-server-name", where));
  TESSERA_ASSIGN_OR_RETURN(config->disable_compression,
                           Bool(entry.node, "disable-compression", where));
  TESSERA_ASSIGN_OR_RETURN(std::string proxy, Scalar(entry.node, "proxy-url", where));
  if (!proxy.empty()) {
    return absl::UnimplementedError(fmt::format(
        "{}: proxy-url is not supported (set HTTPS_PROXY in the environment instead)", where));
  }
  return absl::OkStatus();
}

absl::Status ResolveUser(const Entry& entry, const std::string& name, const ReadFileFunc& read,
                         RestConfig* config) {
  const std::string where = fmt::format("kubeconfig {}: user {}", entry.file, name);
  if (Present(entry.node, "exec")) {
    return absl::UnimplementedError(
        fmt::format("{} uses an exec credential plugin, which tessera does not support; "
                    "give the user a token, tokenFile or client certificate",
                    where));
  }
  if (Present(entry.node, "auth-provider")) {
    return absl::UnimplementedError(
        fmt::format("{} uses an auth-provider, which tessera does not support; "
                    "give the user a token, tokenFile or client certificate",
                    where));
  }
  for (const char* key : {"username", "password"}) {
    TESSERA_ASSIGN_OR_RETURN(std::string value, Scalar(entry.node, key, where));
    if (!value.empty()) {
      return absl::UnimplementedError(
          fmt::format("{} uses basic authentication, which tessera does not support", where));
    }
  }
  for (const char* key : {"as", "as-uid", "as-groups", "as-user-extra"}) {
    if (Present(entry.node, key)) {
      const YAML::Node& value = entry.node[key];
      const bool empty = (value.IsScalar() && value.Scalar().empty()) ||
                         ((value.IsSequence() || value.IsMap()) && value.size() == 0);
      if (!empty) {
        return absl::UnimplementedError(
            fmt::format("{} uses impersonation ({}), which tessera does not support", where, key));
      }
    }
  }
  TESSERA_ASSIGN_OR_RETURN(config->client_cert_pem, DataOrFile(entry, "client-certificate-data",
                                                               "client-certificate", where, read));
  TESSERA_ASSIGN_OR_RETURN(config->client_key_pem,
                           DataOrFile(entry, "client-key-data", "client-key", where, read));
  if (config->client_cert_pem.empty() != config->client_key_pem.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: a client certificate needs a client key and vice versa", where));
  }
  TESSERA_ASSIGN_OR_RETURN(std::string token, Scalar(entry.node, "token", where));
  config->bearer_token = std::string(absl::StripAsciiWhitespace(token));
  TESSERA_ASSIGN_OR_RETURN(std::string token_file, Scalar(entry.node, "tokenFile", where));
  if (!token_file.empty()) {
    config->token_file = ResolvePath(entry.dir, token_file);
  }
  return absl::OkStatus();
}

std::string JoinFiles(const std::vector<std::string>& files) {
  std::string out;
  for (const std::string& f : files) {
    if (!out.empty()) {
      out += ":";
    }
    out += f;
  }
  return out;
}

// Picks the context of the merged files and resolves its cluster and user.
absl::StatusOr<RestConfig> ResolveMerged(const Merged& merged, const KubeconfigOptions& options,
                                         const ReadFileFunc& read) {
  const std::string files = JoinFiles(merged.files);
  const std::string context_name =
      options.context.empty() ? merged.current_context : options.context;
  if (context_name.empty()) {
    return absl::NotFoundError(
        fmt::format("kubeconfig {}: no current-context and no context given", files));
  }
  auto ctx = merged.contexts.find(context_name);
  if (ctx == merged.contexts.end()) {
    return absl::NotFoundError(
        fmt::format("kubeconfig {}: context {} not found", files, context_name));
  }
  const std::string ctx_where =
      fmt::format("kubeconfig {}: context {}", ctx->second.file, context_name);
  TESSERA_ASSIGN_OR_RETURN(std::string cluster_name,
                           Scalar(ctx->second.node, "cluster", ctx_where));
  TESSERA_ASSIGN_OR_RETURN(std::string user_name, Scalar(ctx->second.node, "user", ctx_where));
  TESSERA_ASSIGN_OR_RETURN(std::string ns, Scalar(ctx->second.node, "namespace", ctx_where));

  RestConfig config;
  config.source = fmt::format("kubeconfig {} (context {})", files, context_name);
  if (!ns.empty()) {
    config.namespace_ = ns;
  }
  if (cluster_name.empty()) {
    return absl::InvalidArgumentError(fmt::format("{} names no cluster", ctx_where));
  }
  auto cluster = merged.clusters.find(cluster_name);
  if (cluster == merged.clusters.end()) {
    return absl::NotFoundError(
        fmt::format("{}: cluster {} not found in {}", ctx_where, cluster_name, files));
  }
  TESSERA_RETURN_IF_ERROR(ResolveCluster(cluster->second, cluster_name, read, &config));
  if (!user_name.empty()) {
    auto user = merged.users.find(user_name);
    if (user == merged.users.end()) {
      return absl::NotFoundError(
          fmt::format("{}: user {} not found in {}", ctx_where, user_name, files));
    }
    TESSERA_RETURN_IF_ERROR(ResolveUser(user->second, user_name, read, &config));
  }
  return config;
}

}  // namespace

std::optional<std::string> ProcessGetenv(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) {
    return std::nullopt;
  }
  return std::string(value);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(fmt::format("{}: no such file", path));
    }
    if (err == EACCES) {
      return absl::PermissionDeniedError(fmt::format("{}: permission denied", path));
    }
    return absl::InternalError(fmt::format("{}: cannot open: {}", path, ErrnoText(err)));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    return absl::InternalError(fmt::format("{}: read error", path));
  }
  return std::move(buffer).str();
}

std::string RestConfig::DebugString() const {
  auto set = [](const std::string& s) { return s.empty() ? "<none>" : "<set>"; };
  return fmt::format(
      "server={} source=\"{}\" namespace={} ca={} insecure_skip_tls_verify={} "
      "tls_server_name={} client_cert={} client_key={} token={} token_file={} qps={} burst={}",
      server, source, namespace_, ca_pem.empty() ? "<system>" : "<set>", insecure_skip_tls_verify,
      tls_server_name.empty() ? "<none>" : tls_server_name, set(client_cert_pem),
      set(client_key_pem), set(bearer_token), token_file.empty() ? "<none>" : token_file, qps,
      burst);
}

absl::StatusOr<RestConfig> LoadKubeconfig(const KubeconfigOptions& options) {
  const ReadFileFunc read = options.read_file ? options.read_file : ReadFileFunc(ReadFileToString);
  Merged merged;
  try {
    if (!options.path.empty()) {
      TESSERA_RETURN_IF_ERROR(MergeFile(options.path, read, &merged));
    } else if (std::optional<std::string> env = options.getenv("KUBECONFIG");
               env.has_value() && !env->empty()) {
      std::vector<std::string> seen;
      for (absl::string_view piece : absl::StrSplit(*env, ':', absl::SkipEmpty())) {
        std::string file(piece);
        bool duplicate = false;
        for (const std::string& s : seen) {
          duplicate = duplicate || s == file;
        }
        if (duplicate) {
          continue;
        }
        seen.push_back(file);
        if (!FileExists(file)) {
          TESSERA_VLOG(1, "KUBECONFIG entry {} does not exist; skipped", file);
          continue;
        }
        TESSERA_RETURN_IF_ERROR(MergeFile(file, read, &merged));
      }
      if (merged.files.empty()) {
        return absl::NotFoundError(
            fmt::format("none of the KUBECONFIG files exist: {}", JoinFiles(seen)));
      }
    } else {
      std::optional<std::string> home = options.getenv("HOME");
      if (!home.has_value() || home->empty()) {
        return absl::NotFoundError("no kubeconfig: --kubeconfig, KUBECONFIG and HOME are unset");
      }
      const std::string file = ResolvePath(*home, kHomeKubeconfig);
      TESSERA_RETURN_IF_ERROR(MergeFile(file, read, &merged));
    }

    return ResolveMerged(merged, options, read);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        fmt::format("kubeconfig: invalid structure at line {}: {}", e.mark.line + 1, e.msg));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(fmt::format("kubeconfig: {}", e.what()));
  }
}

absl::StatusOr<RestConfig> ParseKubeconfig(std::string_view content, const std::string& file_name,
                                           const KubeconfigOptions& options) {
  const ReadFileFunc read = options.read_file ? options.read_file : ReadFileFunc(ReadFileToString);
  Merged merged;
  try {
    TESSERA_RETURN_IF_ERROR(MergeContent(content, file_name, &merged));
    return ResolveMerged(merged, options, read);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        fmt::format("kubeconfig: invalid structure at line {}: {}", e.mark.line + 1, e.msg));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(fmt::format("kubeconfig: {}", e.what()));
  }
}

absl::StatusOr<RestConfig> InClusterConfig(const InClusterOptions& options) {
  std::optional<std::string> host = options.getenv("KUBERNETES_SERVICE_HOST");
  std::optional<std::string> port = options.getenv("KUBERNETES_SERVICE_PORT");
  if (!host.has_value() || host->empty() || !port.has_value() || port->empty()) {
    return absl::FailedPreconditionError(
        "not running in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be "
        "set");
  }
  RestConfig config;
  config.source = "in-cluster";
  const bool ipv6 = host->find(':') != std::string::npos;
  config.server = ipv6 ? fmt::format("https://[{}]:{}", *host, *port)
                       : fmt::format("https://{}:{}", *host, *port);
  const std::string dir = options.service_account_dir;
  config.token_file = ResolvePath(dir, "token");
  // The token must be readable now; later reads go through FileTokenSource.
  TESSERA_ASSIGN_OR_RETURN(std::string token, ReadFileToString(config.token_file));
  (void)token;
  absl::StatusOr<std::string> ca = ReadFileToString(ResolvePath(dir, "ca.crt"));
  if (ca.ok()) {
    config.ca_pem = *std::move(ca);
  } else {
    TESSERA_LOG(kWarning, "in-cluster CA not loaded ({}); using the system trust store",
                std::string(ca.status().message()));
  }
  if (std::optional<std::string> ns = options.getenv("POD_NAMESPACE");
      ns.has_value() && !ns->empty()) {
    config.namespace_ = *ns;
  } else if (absl::StatusOr<std::string> file = ReadFileToString(ResolvePath(dir, "namespace"));
             file.ok() && !absl::StripAsciiWhitespace(*file).empty()) {
    config.namespace_ = std::string(absl::StripAsciiWhitespace(*file));
  }
  return config;
}

absl::StatusOr<RestConfig> LoadRestConfig(const KubeconfigOptions& kubeconfig,
                                          const InClusterOptions& in_cluster) {
  if (!kubeconfig.path.empty()) {
    return LoadKubeconfig(kubeconfig);
  }
  if (std::optional<std::string> env = kubeconfig.getenv("KUBECONFIG");
      env.has_value() && !env->empty()) {
    return LoadKubeconfig(kubeconfig);
  }
  std::optional<std::string> host = in_cluster.getenv("KUBERNETES_SERVICE_HOST");
  std::optional<std::string> port = in_cluster.getenv("KUBERNETES_SERVICE_PORT");
  if (host.has_value() && !host->empty() && port.has_value() && !port->empty()) {
    return InClusterConfig(in_cluster);
  }
  return LoadKubeconfig(kubeconfig);
}

FileTokenSource::FileTokenSource(std::string path, Clock* clock, absl::Duration period,
                                 std::string fallback)
    : path_(std::move(path)), clock_(clock), period_(period), fallback_(std::move(fallback)) {}

absl::StatusOr<std::string> FileTokenSource::Token() {
  MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  if (last_read_.has_value() && now - *last_read_ < period_ && !token_.empty()) {
    return token_;
  }
  absl::StatusOr<std::string> content = ReadFileToString(path_);
  std::string token;
  if (content.ok()) {
    token = std::string(absl::StripAsciiWhitespace(*content));
  }
  if (!token.empty()) {
    token_ = std::move(token);
    last_read_ = now;
    return token_;
  }
  const absl::Status error =
      content.ok() ? absl::FailedPreconditionError(fmt::format("token file {} is empty", path_))
                   : content.status();
  if (!token_.empty()) {
    TESSERA_LOG(kWarning, "re-reading bearer token failed ({}); keeping the previous token",
                std::string(error.message()));
    // Try again at the next period rather than on every request.
    last_read_ = now;
    return token_;
  }
  if (!fallback_.empty()) {
    return fallback_;
  }
  return error;
}

std::shared_ptr<TokenSource> MakeTokenSource(const RestConfig& config, Clock* clock) {
  if (!config.token_file.empty()) {
    return std::make_shared<FileTokenSource>(config.token_file, clock, absl::Minutes(1),
                                             config.bearer_token);
  }
  if (!config.bearer_token.empty()) {
    return std::make_shared<StaticTokenSource>(config.bearer_token);
  }
  return nullptr;
}

}  // namespace tessera::kube
