#include "tessera/apisim/server.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "fmt/core.h"
#include "nlohmann/json.hpp"
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include "tessera/apisim/tls.h"
#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"
#include "tessera/http/server.h"

namespace tessera::apisim {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kJson[] = "application/json";
// What kube-apiserver sends on a watch; clients read the media type without parameters.
constexpr char kWatchJson[] = "application/json;stream=watch";
constexpr absl::Duration kIdleHeartbeat = absl::Seconds(30);

void SetContent(http::Response& res, std::string body, const char* content_type) {
  res.body = std::move(body);
  res.content_type = content_type;
}

bool QueryBool(const http::Request& req, const char* name, bool* present = nullptr) {
  if (!req.HasParam(name)) {
    if (present != nullptr) {
      *present = false;
    }
    return false;
  }
  if (present != nullptr) {
    *present = true;
  }
  std::string v = absl::AsciiStrToLower(req.Param(name));
  return !(v == "0" || v == "false");
}

void SendJson(http::Response& res, int code, const std::string& body) {
  res.status = code;
  SetContent(res, std::string(body), kJson);
}

void SendError(http::Response& res, const absl::Status& status) {
  int code = HttpCodeOf(status);
  res.status = code;
  int retry = RetryAfterOf(status);
  if (retry > 0) {
    res.headers.push_back({"Retry-After", std::to_string(retry)});
  }
  SetContent(res, ToStatusJson(status), kJson);
}

std::string MediaType(const std::string& content_type) {
  std::string ct = content_type.substr(0, content_type.find(';'));
  return absl::AsciiStrToLower(absl::StripAsciiWhitespace(ct));
}

// The parts of an API path.
struct Target {
  const ResourceInfo* resource = nullptr;
  std::string ns;
  std::string name;
  std::string subresource;
};

bool AllowedSubresource(const ResourceInfo& r, const std::string& sub) {
  if (sub.empty()) {
    return true;
  }
  if (sub == "status") {
    return r.has_status;
  }
  return (sub == "binding" || sub == "eviction") && r.group.empty() && r.name == "pods";
}

}  // namespace

class Server::Impl {
 public:
  explicit Impl(const ServerOptions& o) : options_(o), store_(MakeStoreOptions(o), o.clock) {}
  ~Impl() {
    Stop();
    SSL_CTX_free(tls_ctx_);
  }

  static StoreOptions MakeStoreOptions(const ServerOptions& o) {
    StoreOptions so;
    so.watch_history = o.watch_history;
    so.bookmark_interval = o.bookmark_interval;
    return so;
  }

  absl::Status Init() {
    if (!options_.state_file.empty()) {
      std::ifstream probe(options_.state_file);
      if (probe.good()) {
        absl::Status s = store_.LoadState(options_.state_file);
        if (!s.ok()) {
          return absl::InvalidArgumentError(std::string(s.message()));
        }
      }
    }
    store_.EnsureDefaultNamespaces();
    const bool given = !options_.tls_cert_file.empty() || !options_.tls_key_file.empty();
    if (given && (options_.tls_cert_file.empty() || options_.tls_key_file.empty())) {
      return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
    }
    if (given && options_.tls_self_signed) {
      return absl::InvalidArgumentError("--tls-self-signed excludes --tls-cert/--tls-key");
    }
    if (options_.tls_self_signed) {
      TESSERA_ASSIGN_OR_RETURN(PemPair pem, GenerateSelfSignedCert());
      ca_pem_ = pem.cert_pem;
      TESSERA_RETURN_IF_ERROR(MakeTlsContext(pem.cert_pem, pem.key_pem));
    } else if (given) {
      std::ifstream cf(options_.tls_cert_file);
      std::ifstream kf(options_.tls_key_file);
      if (!cf.good() || !kf.good()) {
        return absl::InvalidArgumentError(fmt::format("cannot read --tls-cert {} or --tls-key {}",
                                                      options_.tls_cert_file,
                                                      options_.tls_key_file));
      }
      std::stringstream cs;
      cs << cf.rdbuf();
      std::stringstream ks;
      ks << kf.rdbuf();
      ca_pem_ = cs.str();
      if (!MakeTlsContext(ca_pem_, ks.str()).ok()) {
        return absl::InvalidArgumentError(fmt::format("cannot use certificate {} with key {}",
                                                      options_.tls_cert_file,
                                                      options_.tls_key_file));
      }
    }
    http::ServerOptions so;
    so.threads = 8;
    so.max_threads = options_.max_threads;
    so.thread_name = "apisim-http";
    so.max_body_bytes = options_.max_body_bytes;
    so.read_timeout = absl::Seconds(30);
    so.write_timeout = absl::Seconds(30);
    // Clients pool connections (Tessera's blocking calls keep one per concurrent caller) and
    // each open connection holds a worker thread: idle ones are closed after a second.
    so.keep_alive_timeout = absl::Seconds(1);
    so.tls = tls_ctx_;
    so.error_body = [this](http::Response* res) {
      if (res->status == 413) {
        SendError(*res, ApiError(413, "RequestEntityTooLarge",
                                 fmt::format("Request entity too large: limit is {}",
                                             options_.max_body_bytes)));
      } else {
        SendError(*res, ApiError(res->status, "BadRequest", fmt::format("HTTP {}", res->status)));
      }
    };
    svr_ = std::make_unique<http::Server>(
        [this](http::Request& req, http::Response* res) {
          if (req.method == "HEAD") {
            req.method = "GET";  // the server sends the head of the GET reply
          }
          Handle(req, *res);
          Compress(req, *res);
        },
        std::move(so));
    if (absl::Status s = svr_->Start(options_.host, options_.port); !s.ok()) {
      svr_.reset();
      return absl::UnavailableError(fmt::format("cannot listen on {}:{}: {}", options_.host,
                                                options_.port, std::string(s.message())));
    }
    port_ = svr_->port();
    reaper_ = std::thread([this] { ReapLoop(); });
    return absl::OkStatus();
  }

  void Stop() {
    {
      std::unique_lock<std::mutex> l(stop_mu_);
      if (stopped_) {
        return;
      }
      stopped_ = true;
    }
    stop_cv_.notify_all();
    store_.Shutdown();
    if (svr_) {
      svr_->Stop();
    }
    if (reaper_.joinable()) {
      reaper_.join();
    }
  }

  void ReapLoop() {
    std::unique_lock<std::mutex> l(stop_mu_);
    while (!stopped_) {
      stop_cv_.wait_for(l, absl::ToChronoMilliseconds(options_.reap_interval));
      l.unlock();
      store_.Reap();
      l.lock();
    }
  }

  std::string url() const {
    return fmt::format("{}://{}:{}", tls_ ? "https" : "http", options_.host, port_.load());
  }

  std::string Kubeconfig() const {
    std::string cluster = fmt::format("    server: {}\n", url());
    if (tls_) {
      cluster += fmt::format("    certificate-authority-data: {}\n", absl::Base64Escape(ca_pem_));
    }
    std::string user =
        options_.token.empty() ? "    {}\n" : fmt::format("    token: {}\n", options_.token);
    return fmt::format(
        "apiVersion: v1\nkind: Config\ncurrent-context: apisim\npreferences: {{}}\n"
        "clusters:\n- name: apisim\n  cluster:\n{}"
        "users:\n- name: apisim\n  user:\n{}"
        "contexts:\n- name: apisim\n  context:\n    cluster: apisim\n    user: apisim\n"
        "    namespace: default\n",
        cluster, user);
  }

  // The serving context for a PEM certificate and key.
  absl::Status MakeTlsContext(const std::string& cert_pem, const std::string& key_pem) {
    BIO* cb = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
    BIO* kb = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
    X509* cert = cb == nullptr ? nullptr : PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
    EVP_PKEY* key =
        kb == nullptr ? nullptr : PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
    BIO_free(cb);
    BIO_free(kb);
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    const bool ok = cert != nullptr && key != nullptr && ctx != nullptr &&
                    SSL_CTX_use_certificate(ctx, cert) == 1 &&
                    SSL_CTX_use_PrivateKey(ctx, key) == 1 && SSL_CTX_check_private_key(ctx) == 1;
    X509_free(cert);
    EVP_PKEY_free(key);
    ERR_clear_error();
    if (!ok) {
      SSL_CTX_free(ctx);
      return absl::InternalError("cannot load the certificate and key");
    }
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION);
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    tls_ctx_ = ctx;
    tls_ = true;
    return absl::OkStatus();
  }

  // Response compression as kube-apiserver does it: gzip only, and only for bodies of at least
  // 128 KiB (its defaultGzipThresholdBytes); watch streams and small replies go out plain.
  static void Compress(const http::Request& req, http::Response& res) {
    http::GzipIfAccepted(req, &res, size_t{128} * 1024);
  }

  // ---- dispatch ---------------------------------------------------------------------------

  void Handle(const http::Request& req, http::Response& res) {
    const std::string& path = req.path;
    if (path == "/healthz" || path == "/readyz" || path == "/livez" ||
        absl::StartsWith(path, "/healthz/") || absl::StartsWith(path, "/readyz/") ||
        absl::StartsWith(path, "/livez/")) {
      res.status = 200;
      SetContent(res, "ok", "text/plain; charset=utf-8");
      return;
    }
    if (!options_.token.empty()) {
      std::string auth = std::string(req.Get("Authorization"));
      if (auth != "Bearer " + options_.token) {
        SendError(res, ApiError(401, "Unauthorized", "Unauthorized"));
        return;
      }
    }
    if (absl::StartsWith(path, "/simulator/v1/")) {
      HandleSimulator(req, res);
      return;
    }
    if (path == "/version" || path == "/version/") {
      Json v = Json::object();
      v["major"] = "1";
      v["minor"] = "32";
      v["gitVersion"] = "v1.32.4-tessera-apisim";
      v["gitCommit"] = "0000000000000000000000000000000000000000";
      v["gitTreeState"] = "clean";
      v["buildDate"] = "2026-01-01T00:00:00Z";
      v["goVersion"] = "go1.23.0";
      v["compiler"] = "gc";
      v["platform"] = "linux/amd64";
      SendJson(res, 200, v.dump());
      return;
    }
    if (absl::StartsWith(path, "/openapi/")) {
      HandleOpenApi(req, res);
      return;
    }
    if (path == "/api" || path == "/api/") {
      Json v = Json::object();
      v["kind"] = "APIVersions";
      v["versions"] = Json::array({"v1"});
      v["serverAddressByClientCIDRs"] =
          Json::array({Json{{"clientCIDR", "0.0.0.0/0"},
                            {"serverAddress", fmt::format("{}:{}", options_.host, port_.load())}}});
      SendJson(res, 200, v.dump());
      return;
    }
    if (path == "/apis" || path == "/apis/") {
      Json v = Json::object();
      v["kind"] = "APIGroupList";
      v["apiVersion"] = "v1";
      v["groups"] = Json::array();
      for (const std::string& g : Groups()) {
        v["groups"].push_back(GroupJson(g));
      }
      SendJson(res, 200, v.dump());
      return;
    }
    if (!absl::StartsWith(path, "/api/") && !absl::StartsWith(path, "/apis/")) {
      SendError(res, ApiError(404, "NotFound", "the server could not find the requested resource"));
      return;
    }
    HandleApi(req, res);
  }

  static std::vector<std::string> Groups() {
    std::vector<std::string> out;
    for (const ResourceInfo& r : Resources()) {
      if (!r.group.empty() && std::find(out.begin(), out.end(), r.group) == out.end()) {
        out.push_back(r.group);
      }
    }
    return out;
  }

  static Json GroupJson(const std::string& g) {
    Json gv = Json{{"groupVersion", g + "/v1"}, {"version", "v1"}};
    Json v = Json::object();
    v["kind"] = "APIGroup";
    v["apiVersion"] = "v1";
    v["name"] = g;
    v["versions"] = Json::array({gv});
    v["preferredVersion"] = gv;
    return v;
  }

  static Json ResourceListJson(const std::string& group, const std::string& version) {
    Json v = Json::object();
    v["kind"] = "APIResourceList";
    v["apiVersion"] = "v1";
    v["groupVersion"] = group.empty() ? version : group + "/" + version;
    v["resources"] = Json::array();
    for (const ResourceInfo& r : Resources()) {
      if (r.group != group || r.version != version) {
        continue;
      }
      Json e = Json::object();
      e["name"] = r.name;
      e["singularName"] = r.singular;
      e["namespaced"] = r.namespaced;
      e["kind"] = r.kind;
      e["verbs"] = Json::array({"create", "delete", "get", "list", "patch", "update", "watch"});
      if (!r.short_names.empty()) {
        e["shortNames"] = r.short_names;
      }
      if (r.name == "pods") {
        e["categories"] = Json::array({"all"});
      }
      v["resources"].push_back(e);
      if (r.has_status) {
        v["resources"].push_back(Json{{"name", r.name + "/status"},
                                      {"singularName", ""},
                                      {"namespaced", r.namespaced},
                                      {"kind", r.kind},
                                      {"verbs", Json::array({"get", "patch", "update"})}});
      }
      if (r.group.empty() && r.name == "pods") {
        v["resources"].push_back(Json{{"name", "pods/binding"},
                                      {"singularName", ""},
                                      {"namespaced", true},
                                      {"kind", "Binding"},
                                      {"verbs", Json::array({"create"})}});
        v["resources"].push_back(Json{{"name", "pods/eviction"},
                                      {"singularName", ""},
                                      {"namespaced", true},
                                      {"group", "policy"},
                                      {"version", "v1"},
                                      {"kind", "Eviction"},
                                      {"verbs", Json::array({"create"})}});
      }
    }
    return v;
  }

  // /openapi/v3 index and one document per group version: just enough for kubectl to see
  // that the server validates fields (so `kubectl apply` works with --validate=strict).
  void HandleOpenApi(const http::Request& req, http::Response& res) {
    std::vector<std::pair<std::string, std::string>> gvs = {{"", "v1"}};
    for (const std::string& g : Groups()) {
      gvs.emplace_back(g, "v1");
    }
    if (req.path == "/openapi/v3" || req.path == "/openapi/v3/") {
      Json idx = Json::object();
      idx["paths"] = Json::object();
      for (const auto& [g, v] : gvs) {
        std::string p = g.empty() ? "api/" + v : fmt::format("apis/{}/{}", g, v);
        idx["paths"][p]["serverRelativeURL"] = "/openapi/v3/" + p + "?hash=tessera1";
      }
      SendJson(res, 200, idx.dump());
      return;
    }
    for (const auto& [g, v] : gvs) {
      std::string p =
          g.empty() ? "/openapi/v3/api/" + v : fmt::format("/openapi/v3/apis/{}/{}", g, v);
      if (req.path != p) {
        continue;
      }
      Json doc = Json::object();
      doc["openapi"] = "3.0.0";
      doc["info"] = Json{{"title", "Kubernetes (tessera apisim)"}, {"version", "v1.32.4"}};
      doc["paths"] = Json::object();
      for (const ResourceInfo& r : Resources()) {
        if (r.group != g) {
          continue;
        }
        std::string base = g.empty() ? "/api/" + v : fmt::format("/apis/{}/{}", g, v);
        std::string coll =
            r.namespaced ? base + "/namespaces/{namespace}/" + r.name : base + "/" + r.name;
        Json gvk = Json{{"group", g}, {"version", v}, {"kind", r.kind}};
        Json params = Json::array();
        for (const char* q : {"fieldValidation", "fieldManager", "dryRun"}) {
          params.push_back(
              Json{{"name", q}, {"in", "query"}, {"schema", Json{{"type", "string"}}}});
        }
        auto op = [&](const std::string& action) {
          return Json{{"operationId", action + r.kind},
                      {"x-kubernetes-action", action},
                      {"x-kubernetes-group-version-kind", gvk},
                      {"parameters", params},
                      {"responses", Json{{"200", Json{{"description", "OK"}}}}}};
        };
        doc["paths"][coll] = Json{{"get", op("list")}, {"post", op("post")}};
        doc["paths"][coll + "/{name}"] = Json{{"get", op("get")},
                                              {"put", op("put")},
                                              {"patch", op("patch")},
                                              {"delete", op("delete")}};
        if (r.has_status) {
          doc["paths"][coll + "/{name}/status"] =
              Json{{"get", op("get")}, {"put", op("put")}, {"patch", op("patch")}};
        }
      }
      doc["components"] = Json{{"schemas", Json::object()}};
      SendJson(res, 200, doc.dump());
      return;
    }
    SendError(res, ApiError(404, "NotFound", "the server could not find the requested resource"));
  }

  // Parses /api/v1/... and /apis/{g}/{v}/...; returns false (and answers) on a bad path.
  bool ParseTarget(const http::Request& req, http::Response& res, Target* t) {
    std::vector<std::string> seg = absl::StrSplit(req.path, '/', absl::SkipEmpty());
    std::string group;
    std::string version;
    size_t i = 0;
    if (seg[0] == "api") {
      if (seg.size() < 2) {
        return false;
      }
      version = seg[1];
      i = 2;
    } else {
      if (seg.size() < 3) {
        if (seg.size() == 2) {
          const auto groups = Groups();
          if (std::find(groups.begin(), groups.end(), seg[1]) != groups.end()) {
            SendJson(res, 200, GroupJson(seg[1]).dump());
            return false;
          }
        }
        SendError(res,
                  ApiError(404, "NotFound", "the server could not find the requested resource"));
        return false;
      }
      group = seg[1];
      version = seg[2];
      i = 3;
    }
    std::vector<std::string> rest(seg.begin() + static_cast<std::ptrdiff_t>(i), seg.end());
    if (rest.empty()) {
      bool known = version == "v1" && (group.empty() || FindAnyInGroup(group));
      if (!known) {
        SendError(res,
                  ApiError(404, "NotFound", "the server could not find the requested resource"));
        return false;
      }
      SendJson(res, 200, ResourceListJson(group, version).dump());
      return false;
    }
    std::string resource;
    if (rest[0] == "namespaces" && rest.size() >= 3 &&
        !(group.empty() && rest.size() == 3 && (rest[2] == "status" || rest[2] == "finalize"))) {
      t->ns = rest[1];
      resource = rest[2];
      if (rest.size() > 3) {
        t->name = rest[3];
      }
      if (rest.size() > 4) {
        t->subresource = rest[4];
      }
      if (rest.size() > 5) {
        resource.clear();
      }
    } else {
      resource = rest[0];
      if (rest.size() > 1) {
        t->name = rest[1];
      }
      if (rest.size() > 2) {
        t->subresource = rest[2];
      }
      if (rest.size() > 3) {
        resource.clear();
      }
    }
    t->resource = FindResource(group, version, resource);
    const ResourceInfo* r = t->resource;
    bool ok = r != nullptr && AllowedSubresource(*r, t->subresource);
    if (ok && !r->namespaced && !t->ns.empty()) {
      ok = false;
    }
    if (ok && r->namespaced && t->ns.empty() && !t->name.empty()) {
      ok = false;
    }
    if (!ok) {
      SendError(res, ApiError(404, "NotFound", "the server could not find the requested resource"));
      return false;
    }
    return true;
  }

  static bool FindAnyInGroup(const std::string& g) {
    for (const ResourceInfo& r : Resources()) {
      if (r.group == g) {
        return true;
      }
    }
    return false;
  }

  static std::string VerbOf(const http::Request& req, const Target& t) {
    if (req.method == "GET") {
      if (!t.name.empty()) {
        return "get";
      }
      return QueryBool(req, "watch") ? "watch" : "list";
    }
    if (req.method == "POST") {
      return "create";
    }
    if (req.method == "PUT") {
      return "update";
    }
    if (req.method == "PATCH") {
      return "patch";
    }
    if (req.method == "DELETE") {
      return "delete";
    }
    return absl::AsciiStrToLower(req.method);
  }

  // Applies the latency and request-failure faults. Returns true when it answered.
  bool InjectFault(const std::string& verb, const ResourceInfo& r, http::Response& res) {
    if (!store_.RequestFaultsSet()) {
      return false;  // the common case, without the store's lock
    }
    Faults f = store_.GetFaults();
    if (f.latency_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(f.latency_ms));
    }
    if (f.fail_probability <= 0) {
      return false;
    }
    if (!f.fail_verbs.empty() &&
        std::find(f.fail_verbs.begin(), f.fail_verbs.end(), verb) == f.fail_verbs.end()) {
      return false;
    }
    {
      std::unique_lock<std::mutex> l(fault_mu_);
      if (fault_seed_ != f.seed) {
        fault_seed_ = f.seed;
        fault_rng_.seed(f.seed);
      }
      std::uniform_real_distribution<double> u(0.0, 1.0);
      if (u(fault_rng_) >= f.fail_probability) {
        return false;
      }
    }
    faults_injected_.fetch_add(1);
    const int code = f.fail_code;
    if (code == 429) {
      // What priority-and-fairness sends: a plain-text body, not a Status.
      res.status = 429;
      res.headers.push_back({"Retry-After", "1"});
      SetContent(res, "Too many requests, please try again later.\n", "text/plain; charset=utf-8");
      return true;
    }
    if (code == 410 && verb == "watch") {
      res.status = 200;
      std::string line = "{\"type\":\"ERROR\",\"object\":" +
                         ToStatusJson(ApiError(410, "Expired",
                                               "The resourceVersion for the provided watch is "
                                               "too old.")) +
                         "}\n";
      SetContent(res, line, kWatchJson);
      return true;
    }
    ApiErrorDetails d;
    std::string reason = "InternalError";
    std::string message = "Internal error occurred: injected fault";
    if (code == 410) {
      reason = "Expired";
      message = "The resourceVersion for the provided list is too old.";
    } else if (code == 504) {
      reason = "Timeout";
      message = fmt::format("Timeout: Too large resource version: {}, current: {}",
                            store_.CurrentRevision() + 1000, store_.CurrentRevision());
      d.cause_reason = "ResourceVersionTooLarge";
      d.cause_message = "Too large resource version";
      d.retry_after_seconds = 1;
    } else if (code == 503) {
      reason = "ServiceUnavailable";
      message = "the server is currently unable to handle the request (injected fault)";
      d.retry_after_seconds = 1;
    } else if (code >= 500) {
      d.retry_after_seconds = 1;
    } else if (code == 409) {
      reason = "Conflict";
      message = fmt::format("Operation cannot be fulfilled on {}: injected conflict", r.name);
    } else {
      reason = "BadRequest";
      message = "injected fault";
    }
    SendError(res, ApiError(code, reason, message, d));
    return true;
  }

  void HandleApi(const http::Request& req, http::Response& res) {
    Target t;
    if (!ParseTarget(req, res, &t)) {
      return;
    }
    const ResourceInfo& r = *t.resource;
    const std::string verb = VerbOf(req, t);
    {
      std::unique_lock<std::mutex> l(fault_mu_);
      ++requests_[verb];
    }
    // Content negotiation.
    std::string accept = std::string(req.Get("Accept"));
    if (!accept.empty() && !absl::StrContains(accept, "application/json") &&
        !absl::StrContains(accept, "*/*") && !absl::StrContains(accept, "application/*")) {
      SendError(res, ApiError(406, "NotAcceptable",
                              "only the following media types are accepted: application/json"));
      return;
    }
    if (InjectFault(verb, r, res)) {
      return;
    }
    WriteOptions w;
    w.dry_run = req.HasParam("dryRun") && req.Param("dryRun") == "All";
    if (req.method == "GET") {
      if (!t.name.empty()) {
        Reply(res, 200, store_.Get(r, t.ns, t.name));
        return;
      }
      if (verb == "watch") {
        ServeWatch(req, res, r, t.ns);
        return;
      }
      ListOptions o;
      o.label_selector = req.Param("labelSelector");
      o.field_selector = req.Param("fieldSelector");
      o.resource_version = req.Param("resourceVersion");
      o.resource_version_match = req.Param("resourceVersionMatch");
      o.continue_token = req.Param("continue");
      if (req.HasParam("sendInitialEvents")) {
        ApiErrorDetails d;
        d.group = "meta.k8s.io";
        d.kind = "ListOptions";
        d.cause_reason = "FieldValueForbidden";
        d.cause_field = "sendInitialEvents";
        d.cause_message = "Forbidden: sendInitialEvents is forbidden for list";
        SendError(res, ApiError(422, "Invalid",
                                "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: "
                                "Forbidden: sendInitialEvents is forbidden for list",
                                d));
        return;
      }
      if (req.HasParam("limit") && !absl::SimpleAtoi(req.Param("limit"), &o.limit)) {
        SendError(res, ApiError(400, "BadRequest",
                                fmt::format("strconv.ParseInt: parsing \"{}\": invalid syntax",
                                            req.Param("limit"))));
        return;
      }
      Reply(res, 200, store_.List(r, t.ns, o));
      return;
    }
    if (req.method == "POST" || req.method == "PUT") {
      std::string mt = MediaType(std::string(req.Get("Content-Type")));
      if (!mt.empty() && mt != "application/json" && mt != "*/*") {
        SendError(res, ApiError(415, "UnsupportedMediaType",
                                fmt::format("the body of the request was in an unknown format - "
                                            "accepted media types include: application/json "
                                            "(got {})",
                                            mt)));
        return;
      }
    }
    if (req.method == "POST") {
      if (t.subresource == "binding") {
        Reply(res, 201, store_.Bind(t.ns, t.name, req.body, w));
        return;
      }
      if (t.subresource == "eviction") {
        Reply(res, 201, store_.Evict(t.ns, t.name, req.body, w));
        return;
      }
      if (!t.name.empty() || !t.subresource.empty() || (r.namespaced && t.ns.empty())) {
        MethodNotAllowed(res);
        return;
      }
      Reply(res, 201, store_.Create(r, t.ns, req.body, w));
      return;
    }
    if (t.name.empty() || t.subresource == "binding" || t.subresource == "eviction") {
      MethodNotAllowed(res);
      return;
    }
    if (req.method == "PUT") {
      Reply(res, 200, store_.Update(r, t.ns, t.name, t.subresource, req.body, w));
      return;
    }
    if (req.method == "PATCH") {
      std::string ct = std::string(req.Get("Content-Type"));
      std::optional<PatchType> type = PatchTypeFromContentType(ct);
      if (!type) {
        SendError(res, ApiError(415, "UnsupportedMediaType",
                                fmt::format("the body of the request was in an unknown format - "
                                            "accepted media types include: "
                                            "application/json-patch+json, "
                                            "application/merge-patch+json, "
                                            "application/strategic-merge-patch+json (got {})",
                                            MediaType(ct))));
        return;
      }
      Reply(res, 200, store_.Patch(r, t.ns, t.name, t.subresource, *type, req.body, w));
      return;
    }
    if (req.method == "DELETE" && t.subresource.empty()) {
      absl::StatusOr<std::string> options = DeleteOptionsOf(req);
      if (!options.ok()) {
        SendError(res, options.status());
        return;
      }
      Reply(res, 200, store_.Delete(r, t.ns, t.name, *options, w));
      return;
    }
    MethodNotAllowed(res);
  }

  // The DeleteOptions of a DELETE: its body, with the fields kube-apiserver also accepts as
  // query parameters (gracePeriodSeconds, propagationPolicy) filled in from the query when the
  // body does not set them. A malformed body is left to the store to reject.
  static absl::StatusOr<std::string> DeleteOptionsOf(const http::Request& req) {
    const bool grace = req.HasParam("gracePeriodSeconds");
    const bool policy = req.HasParam("propagationPolicy");
    if (!grace && !policy) {
      return req.body;
    }
    Json opts = Json::object();
    if (req.body.find_first_not_of(" \t\r\n") != std::string::npos) {
      opts = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
      if (!opts.is_object()) {
        return req.body;
      }
    }
    if (grace && !opts.contains("gracePeriodSeconds")) {
      int64_t seconds = 0;
      if (!absl::SimpleAtoi(req.Param("gracePeriodSeconds"), &seconds)) {
        return ApiError(400, "BadRequest",
                        fmt::format("gracePeriodSeconds: invalid value \"{}\": not an integer",
                                    req.Param("gracePeriodSeconds")));
      }
      opts["gracePeriodSeconds"] = seconds;
    }
    if (policy && !opts.contains("propagationPolicy")) {
      opts["propagationPolicy"] = req.Param("propagationPolicy");
    }
    return opts.dump();
  }

  static void MethodNotAllowed(http::Response& res) {
    SendError(res, ApiError(405, "MethodNotAllowed",
                            "the server does not allow this method on the requested resource"));
  }

  static void Reply(http::Response& res, int code, const absl::StatusOr<std::string>& out) {
    if (out.ok()) {
      SendJson(res, code, *out);
    } else {
      SendError(res, out.status());
    }
  }

  void ServeWatch(const http::Request& req, http::Response& res, const ResourceInfo& r,
                  const std::string& ns) {
    WatchOptions o;
    o.label_selector = req.Param("labelSelector");
    o.field_selector = req.Param("fieldSelector");
    o.resource_version = req.Param("resourceVersion");
    o.resource_version_match = req.Param("resourceVersionMatch");
    o.allow_bookmarks = QueryBool(req, "allowWatchBookmarks");
    o.send_initial_events = QueryBool(req, "sendInitialEvents", &o.send_initial_events_set);
    if (req.HasParam("timeoutSeconds")) {
      double secs = 0;
      if (!absl::SimpleAtod(req.Param("timeoutSeconds"), &secs) || secs < 0) {
        SendError(res, ApiError(400, "BadRequest", "timeoutSeconds must be a number"));
        return;
      }
      o.timeout_seconds = secs;
      if (secs == 0) {
        o.timeout_seconds = -1;
      }
    }
    absl::StatusOr<std::unique_ptr<WatchStream>> w = store_.Watch(r, ns, o);
    if (!w.ok()) {
      SendError(res, w.status());
      return;
    }
    std::shared_ptr<WatchStream> stream = std::move(*w);
    res.status = 200;
    res.headers.push_back({"Cache-Control", "no-cache, private"});
    res.content_type = kWatchJson;
    res.stream = [stream, clock = options_.clock](http::StreamWriter& sink) {
      std::string out;
      absl::Time idle_since = clock->Now();
      while (true) {
        switch (stream->Next(&out, absl::Milliseconds(250))) {
          case WatchStream::Step::kData:
            if (!sink.Write(out)) {
              return false;
            }
            idle_since = clock->Now();
            break;
          case WatchStream::Step::kEnd:
            return true;
          case WatchStream::Step::kAbort:
            return false;
          case WatchStream::Step::kIdle:
            if (sink.ClientGone()) {
              return false;
            }
            if (clock->Now() - idle_since >= kIdleHeartbeat) {
              // A blank line: ignored by every client's JSON framing, and it lets us notice
              // a client that went away.
              if (!sink.Write("\n")) {
                return false;
              }
              idle_since = clock->Now();
            }
            break;
        }
      }
    };
  }

  // ---- /simulator/v1 ----------------------------------------------------------------------

  void HandleSimulator(const http::Request& req, http::Response& res) {
    const std::string what = req.path.substr(sizeof("/simulator/v1/") - 1);
    if (what == "sever-watches" && req.method == "POST") {
      int n = store_.SeverWatches();
      SendJson(res, 200, Json{{"severed", n}}.dump());
      return;
    }
    if (what == "compact" && req.method == "POST") {
      uint64_t rv = store_.Compact();
      SendJson(res, 200, Json{{"compactedRevision", std::to_string(rv)}}.dump());
      return;
    }
    if (what == "snapshot" && req.method == "POST") {
      const uint64_t rv = store_.Snapshot();
      SendJson(res, 200, Json{{"snapshotRevision", std::to_string(rv)}}.dump());
      return;
    }
    if (what == "restore" && req.method == "POST") {
      absl::StatusOr<uint64_t> bump = ParseRestore(req.body);
      if (!bump.ok()) {
        SendError(res, bump.status());
        return;
      }
      absl::StatusOr<uint64_t> rv = store_.Restore(*bump);
      if (!rv.ok()) {
        SendError(res, ApiError(400, "BadRequest", std::string(rv.status().message())));
        return;
      }
      SendJson(res, 200, Json{{"resourceVersion", std::to_string(*rv)}}.dump());
      return;
    }
    if (what == "save" && req.method == "POST") {
      absl::Status s = SaveState();
      if (!s.ok()) {
        SendError(res, ApiError(absl::IsFailedPrecondition(s) ? 400 : 500,
                                absl::IsFailedPrecondition(s) ? "BadRequest" : "InternalError",
                                std::string(s.message())));
        return;
      }
      SendJson(res, 200, Json{{"saved", options_.state_file}}.dump());
      return;
    }
    if (what == "stats" && req.method == "GET") {
      Json stats = Json::parse(store_.StatsJson());
      std::unique_lock<std::mutex> l(fault_mu_);
      stats["requests"] = Json(requests_);
      stats["faultsInjected"] = faults_injected_.load();
      SendJson(res, 200, stats.dump());
      return;
    }
    if (what == "evictions" && req.method == "GET") {
      SendJson(res, 200, store_.EvictionsJson());
      return;
    }
    if (what == "faults") {
      if (req.method == "GET") {
        SendJson(res, 200, FaultsJson(store_.GetFaults()).dump());
        return;
      }
      if (req.method == "DELETE") {
        store_.SetFaults(Faults{});
        SendJson(res, 200, FaultsJson(Faults{}).dump());
        return;
      }
      if (req.method == "PUT") {
        absl::StatusOr<Faults> f = ParseFaults(req.body);
        if (!f.ok()) {
          SendError(res, f.status());
          return;
        }
        store_.SetFaults(*f);
        SendJson(res, 200, FaultsJson(*f).dump());
        return;
      }
      MethodNotAllowed(res);
      return;
    }
    SendError(res, ApiError(404, "NotFound", fmt::format("no simulator endpoint {}", req.path)));
  }

  static Json FaultsJson(const Faults& f) {
    Json o = Json::object();
    o["dropWatchEvents"] = Json::array();
    for (const DropRule& d : f.drop_watch_events) {
      o["dropWatchEvents"].push_back(Json{{"resource", d.resource},
                                          {"type", d.type},
                                          {"probability", d.probability},
                                          {"count", d.count}});
    }
    o["pauseWatches"] = f.pause_watches;
    o["failRequests"] =
        Json{{"probability", f.fail_probability}, {"code", f.fail_code}, {"verbs", f.fail_verbs}};
    o["latencyMs"] = f.latency_ms;
    o["seed"] = f.seed;
    return o;
  }

  // The body of POST /simulator/v1/restore: empty, or {"bumpRevision":N} (N >= 0). Returns N.
  static absl::StatusOr<uint64_t> ParseRestore(const std::string& body) {
    if (body.empty()) {
      return 0;
    }
    auto bad = [](const std::string& m) {
      return ApiError(400, "BadRequest", "invalid restore request: " + m);
    };
    Json j = Json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return bad("the body must be a JSON object");
    }
    uint64_t bump = 0;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() != "bumpRevision") {
        return bad(fmt::format("unknown field \"{}\"", it.key()));
      }
      if (!it.value().is_number_unsigned()) {
        return bad("bumpRevision must be a non-negative integer");
      }
      bump = it.value().get<uint64_t>();
    }
    return bump;
  }

  static absl::StatusOr<Faults> ParseFaults(const std::string& body) {
    auto bad = [](const std::string& m) {
      return ApiError(400, "BadRequest", "invalid fault configuration: " + m);
    };
    Json j = Json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return bad("the body must be a JSON object");
    }
    Faults f;
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      const Json& v = it.value();
      if (k == "dropWatchEvents") {
        if (!v.is_array()) {
          return bad("dropWatchEvents must be a list");
        }
        for (const Json& d : v) {
          if (!d.is_object()) {
            return bad("each dropWatchEvents entry must be an object");
          }
          DropRule rule;
          for (auto dit = d.begin(); dit != d.end(); ++dit) {
            const Json& dv = dit.value();
            if (dit.key() == "resource" && dv.is_string()) {
              rule.resource = dv.get<std::string>();
            } else if (dit.key() == "type" && dv.is_string()) {
              rule.type = dv.get<std::string>();
              if (!rule.type.empty() && rule.type != "ADDED" && rule.type != "MODIFIED" &&
                  rule.type != "DELETED") {
                return bad("type must be ADDED, MODIFIED or DELETED");
              }
            } else if (dit.key() == "probability" && dv.is_number()) {
              rule.probability = dv.get<double>();
            } else if (dit.key() == "count" && dv.is_number_integer()) {
              rule.count = dv.get<int64_t>();
            } else {
              return bad(fmt::format("dropWatchEvents: bad field \"{}\"", dit.key()));
            }
          }
          if (rule.probability < 0 || rule.probability > 1) {
            return bad("probability must be within [0, 1]");
          }
          f.drop_watch_events.push_back(rule);
        }
      } else if (k == "pauseWatches") {
        if (!v.is_boolean()) {
          return bad("pauseWatches must be a boolean");
        }
        f.pause_watches = v.get<bool>();
      } else if (k == "failRequests") {
        if (!v.is_object()) {
          return bad("failRequests must be an object");
        }
        for (auto fit = v.begin(); fit != v.end(); ++fit) {
          const Json& fv = fit.value();
          if (fit.key() == "probability" && fv.is_number()) {
            f.fail_probability = fv.get<double>();
          } else if (fit.key() == "code" && fv.is_number_integer()) {
            f.fail_code = fv.get<int>();
          } else if (fit.key() == "verbs" && fv.is_array()) {
            for (const Json& verb : fv) {
              if (!verb.is_string()) {
                return bad("verbs must be strings");
              }
              f.fail_verbs.push_back(verb.get<std::string>());
            }
          } else {
            return bad(fmt::format("failRequests: bad field \"{}\"", fit.key()));
          }
        }
        if (f.fail_probability < 0 || f.fail_probability > 1) {
          return bad("probability must be within [0, 1]");
        }
        if (f.fail_code < 400 || f.fail_code > 599) {
          return bad("code must be a 4xx or 5xx status");
        }
      } else if (k == "latencyMs") {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 60000) {
          return bad("latencyMs must be an integer in [0, 60000]");
        }
        f.latency_ms = v.get<int>();
      } else if (k == "seed") {
        if (!v.is_number_unsigned()) {
          return bad("seed must be a non-negative integer");
        }
        f.seed = v.get<uint64_t>();
      } else {
        return bad(fmt::format("unknown field \"{}\"", k));
      }
    }
    return f;
  }

  absl::Status SaveState() {
    if (options_.state_file.empty()) {
      return absl::FailedPreconditionError("no --state file configured");
    }
    return store_.SaveState(options_.state_file);
  }

  const ServerOptions options_;
  Store store_;
  SSL_CTX* tls_ctx_ = nullptr;  // owned; freed after svr_ has stopped
  std::unique_ptr<http::Server> svr_;
  bool tls_ = false;
  std::string ca_pem_;
  // Written once Init has started the server, whose workers read it (/api): atomic.
  std::atomic<int> port_{0};
  std::thread reaper_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopped_ = false;
  std::mutex fault_mu_;
  std::mt19937_64 fault_rng_{1};
  uint64_t fault_seed_ = 1;
  std::map<std::string, uint64_t> requests_;
  std::atomic<uint64_t> faults_injected_{0};
};

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  TESSERA_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Stop(); }
void Server::Stop() { impl_->Stop(); }
int Server::port() const { return impl_->port_.load(); }
std::string Server::url() const { return impl_->url(); }
const std::string& Server::ca_pem() const { return impl_->ca_pem_; }
Store& Server::store() { return impl_->store_; }
absl::Status Server::SaveState() { return impl_->SaveState(); }
std::string Server::Kubeconfig() const { return impl_->Kubeconfig(); }

}  // namespace tessera::apisim
