// The Ascend differential against HAMi v2.10.0's own code: every line of the vectors file is a
// generated case (tools/gen/ascend_cases.py) with HAMi's answer to it (test/hami/v2.10.0/
// ascendoracle, HAMi's pkg/device/ascend as a library), and Tessera must answer the same —
// request derivation, the webhook's mutation and refusals, registration decoding, the device
// sort and Fit (fit, reason string, cards), the pod annotations and the node score. The only
// tolerated differences are docs/compatibility.md's: a malformed value is an error where HAMi
// reads no request (or, for a fractional memory, the whole card), and where HAMi breaks a tie in
// Go map order Tessera's cards must be one of the answers HAMi gave.
//
// The file (gzip or plain JSON lines): $TESSERA_ASCEND_VECTORS, else the committed
// test/testdata/hami/ascend-v2.10.0.jsonl.gz (tools/gen/ascend_vectors.sh, 3000 cases);
// test/hami/ascend_differential.sh runs fresh cases through the same check.
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "zlib.h"

#include "tessera/device/ascend.h"
#include "tessera/device/codec.h"
#include "tessera/device/quantity.h"
#include "tessera/schedule/fit.h"

namespace tessera::schedule {
namespace {

using json = nlohmann::json;

std::string VectorsPath() {
  if (const char* p = std::getenv("TESSERA_ASCEND_VECTORS"); p != nullptr && *p != '\0') {
    return p;
  }
  const char* dir = std::getenv("TESSERA_SOURCE_DIR");
  return std::string(dir != nullptr ? dir : ".") + "/test/testdata/hami/ascend-v2.10.0.jsonl.gz";
}

// The lines of a gzip or plain file (zlib reads both); nullopt when it cannot be read.
std::optional<std::vector<std::string>> ReadLines(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return std::nullopt;
  }
  std::vector<std::string> lines;
  std::string line;
  char buf[1 << 16];
  while (gzgets(f, buf, sizeof(buf)) != nullptr) {
    line += buf;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      lines.push_back(std::move(line));
      line.clear();
    }
  }
  if (!line.empty()) {
    lines.push_back(std::move(line));
  }
  gzclose(f);
  return lines;
}

device::AscendChipConfig Chip(const json& j) {
  device::AscendChipConfig c;
  c.common_word = j.value("commonWord", "");
  c.chip_name = j.value("chipName", "");
  c.resource_name = j.value("resourceName", "");
  c.resource_memory_name = j.value("resourceMemoryName", "");
  c.resource_core_name = j.value("resourceCoreName", "");
  c.memory_allocatable = j.value("memoryAllocatable", int64_t{0});
  c.memory_capacity = j.value("memoryCapacity", int64_t{0});
  c.memory_factor = j.value("memoryFactor", 0);
  c.ai_core = j.value("aiCore", 0);
  c.runtime_class_name = j.value("runtimeClassName", "");
  c.overwrite_env = j.value("overwriteEnv", false);
  c.super_pod = j.value("superPod", false);
  for (const json& t : j.value("templates", json::array())) {
    c.templates.push_back({t.value("name", ""), t.value("memory", int64_t{0}), 0, 0});
  }
  std::stable_sort(c.templates.begin(), c.templates.end(),
                   [](const auto& a, const auto& b) { return a.memory < b.memory; });
  return c;
}

kube::ResourceList Resources(const json& j) {
  kube::ResourceList out;
  for (const auto& [k, v] : j.items()) {
    out.Set(k, v.get<std::string>());
  }
  return out;
}

kube::Container ContainerOf(const json& c) {
  kube::Container out;
  out.name = "main";
  out.limits = Resources(c.value("limits", json::object()));
  out.requests = Resources(c.value("requests", json::object()));
  return out;
}

kube::Pod PodOf(const json& c) {
  kube::Pod pod;
  pod.meta.ns = "default";
  pod.meta.name = "p";
  const json annotations = c.value("annotations", json::object());
  for (const auto& [k, v] : annotations.items()) {
    pod.meta.annotations.Set(k, v.get<std::string>());
  }
  pod.containers = {ContainerOf(c)};
  return pod;
}

bool HamiCore(const json& c) {
  json a = c.value("annotations", json::object());
  return a.value("huawei.com/vnpu-mode", "") == "hami-core";
}

// The custominfo of a device as HAMi's Go decoder sees it.
void SetNetwork(const json& d, device::DeviceInfo* info) {
  auto it = d.find("custominfo");
  if (it == d.end() || !it->is_object() || !it->contains("NetworkID")) {
    return;
  }
  const json& id = (*it)["NetworkID"];
  if (id.is_number()) {
    info->network_key = device::NetworkKey::kNumber;
    info->network_id = static_cast<int64_t>(id.get<double>());
  } else {
    info->network_key = device::NetworkKey::kOther;
  }
}

device::NodeSnapshot SnapshotOf(const json& c) {
  auto nd = std::make_shared<device::NodeDevices>();
  nd->node = "n";
  device::NodeSnapshot snap;
  for (const json& d : c["devices"]) {
    device::DeviceInfo info;
    info.id = d["id"].get<std::string>();
    info.index = d.value("index", 0);
    info.count = d.value("count", 0);
    info.devmem = d.value("devmem", 0);
    info.devcore = d.value("devcore", 0);
    info.type = d.value("type", "");
    info.numa = d.value("numa", 0);
    info.health = d.value("health", false);
    SetNetwork(d, &info);
    nd->devices.push_back(info);
    snap.usage.push_back(device::DeviceUsage{d.value("used", 0), d.value("usedmem", int64_t{0}),
                                             d.value("usedcores", int64_t{0})});
  }
  json node_annotations = c.value("nodeAnnotations", json::object());
  nd->hami_core_allowed = node_annotations.contains("hami-vnpu-core")
                              ? node_annotations["hami-vnpu-core"] == "true"
                              : c.value("hamiVnpuCore", false);
  snap.devices = std::move(nd);
  return snap;
}

device::PodDevices PodDevicesOf(const json& c) {
  device::PodDevices out;
  for (const json& ctr : c["podDevices"]) {
    device::ContainerDevices devs;
    for (const json& d : ctr) {
      devs.push_back({d["UUID"].get<std::string>(), d["Type"].get<std::string>(),
                      d["Usedmem"].get<int32_t>(), d["Usedcores"].get<int32_t>()});
    }
    out.push_back(std::move(devs));
  }
  return out;
}

// The value of resource `name` as the container gives it (limits, else requests), or "".
std::string Given(const json& c, const std::string& name) {
  for (const char* where : {"limits", "requests"}) {
    json m = c.value(where, json::object());
    if (m.contains(name)) {
      return m[name].get<std::string>();
    }
  }
  return "";
}

// Whether Kubernetes' Quantity.AsInt64, which HAMi's request derivation uses, fails for `text`
// although Tessera reads an integer or refuses it: a value written with a fraction, a milli,
// micro or nano suffix or a negative exponent ("1000m", "1.5"), however whole. HAMi then reads
// no request (the count) or no memory (the whole card); docs/compatibility.md.
bool KubeAsInt64Fails(const std::string& text) {
  if (text.empty()) {
    return false;
  }
  const char last = text.back();
  return text.find('.') != std::string::npos || last == 'm' || last == 'u' || last == 'n' ||
         text.find("e-") != std::string::npos || text.find("E-") != std::string::npos;
}

// Why Tessera's answer to case `c` is not HAMi's `h`; "" when they agree.
std::string CheckRequest(const json& c, const json& h) {
  const device::AscendChipConfig chip = Chip(c["chip"]);
  absl::StatusOr<std::optional<device::ContainerRequest>> r =
      device::DeriveAscendRequest(chip, ContainerOf(c));
  const int hami_nums = h["nums"].get<int>();
  if (KubeAsInt64Fails(Given(c, chip.resource_name)) ||
      KubeAsInt64Fails(Given(c, chip.resource_memory_name))) {
    return "";  // declared: Tessera reads what Kubernetes means
  }
  if (!r.ok()) {
    return hami_nums == 0
               ? ""
               : "Tessera refuses what HAMi requests: " + std::string(r.status().message());
  }
  if (!r->has_value()) {
    return hami_nums == 0 ? "" : "Tessera asks nothing";
  }
  const device::ContainerRequest& t = **r;
  const int pct = t.mem_percentage == device::kPercentageUnset ? 0 : t.mem_percentage;
  if (t.nums != hami_nums || t.type != h["type"] || t.memreq != h["memreq"].get<int>() ||
      pct != h["pct"].get<int>() || t.coresreq != h["cores"].get<int>()) {
    return "request differs: Tessera " + std::to_string(t.nums) + " " + t.type + " " +
           std::to_string(t.memreq) + " " + std::to_string(pct) + " " + std::to_string(t.coresreq);
  }
  return "";
}

std::string CheckAdmit(const json& c, const json& h) {
  const device::AscendChipConfig chip = Chip(c["chip"]);
  absl::StatusOr<device::AscendAdmission> a =
      device::AdmitAscendContainer(chip, ContainerOf(c), HamiCore(c));
  if (h.contains("error")) {
    if (a.ok()) {
      return "Tessera admits what HAMi refuses";
    }
    return std::string(a.status().message()) == h["error"] ? "" : "refusal text differs";
  }
  if (!a.ok()) {
    return "Tessera refuses what HAMi admits: " + std::string(a.status().message());
  }
  if (a->found != h["found"].get<bool>()) {
    return "found differs";
  }
  if (h["env"].get<int>() != (a->empty_visible_devices ? 1 : 0)) {
    return "env differs";
  }
  if (!a->found) {
    return "";
  }
  const json limits = h.value("limits", json::object());
  const json requests = h.value("requests", json::object());
  // HAMi's marshalled pod carries the quantity in Kubernetes' canonical form: 40000 is "40k".
  const std::string mem = device::Quantity::FromInt64(a->memory).ToString();
  if (limits.value(chip.resource_memory_name, "") != mem ||
      requests.value(chip.resource_memory_name, "") != mem) {
    return "memory written differs: Tessera " + mem;
  }
  // The count: rewritten to 2, or left as it was (in Kubernetes' canonical form).
  absl::StatusOr<device::Quantity> asked =
      device::ParseQuantity(c["limits"][chip.resource_name].get<std::string>());
  if (!asked.ok()) {
    return "the case's count does not parse";
  }
  const std::string count = a->count.has_value() ? "2" : asked->ToString();
  if (limits.value(chip.resource_name, "") != count) {
    return "count written differs: Tessera " + count;
  }
  if (h.contains("runtimeClassName") != !chip.runtime_class_name.empty()) {
    return "runtimeClassName differs";
  }
  return "";
}

std::string CheckRegister(const json& c, const json& h) {
  const device::AscendChipConfig chip = Chip(c["chip"]);
  kube::Node node;
  node.meta.name = "n";
  node.meta.annotations.Set("hami.io/node-register-" + chip.common_word,
                            c["value"].get<std::string>());
  absl::StatusOr<device::NodeDevices> n =
      device::NewAscendVendor(chip, c.value("hamiVnpuCore", false))->DecodeNode(node);
  if (h.contains("error")) {
    return n.ok() ? "Tessera decodes what HAMi refuses" : "";
  }
  if (!n.ok()) {
    return "Tessera refuses what HAMi decodes: " + std::string(n.status().message());
  }
  const json& want = h["devices"];
  if (want.size() != n->devices.size()) {
    return "device count differs";
  }
  for (size_t i = 0; i < want.size(); ++i) {
    const json& w = want[i];
    const device::DeviceInfo& d = n->devices[i];
    device::DeviceInfo expect;
    SetNetwork(w, &expect);
    if (d.id != w.value("id", "") || d.index != w.value("index", 0) ||
        d.count != w.value("count", 0) || d.devmem != w.value("devmem", 0) ||
        d.devcore != w.value("devcore", 0) || d.type != w.value("type", "") ||
        d.numa != w.value("numa", 0) || d.health != w.value("health", false) ||
        d.network_key != expect.network_key || d.network_id != expect.network_id) {
      return "device " + std::to_string(i) + " differs";
    }
  }
  return "";
}

std::string CheckFit(const json& c, const json& h) {
  const device::AscendChipConfig chip = Chip(c["chip"]);
  const kube::Pod pod = PodOf(c);
  std::unique_ptr<device::Vendor> vendor =
      device::NewAscendVendor(chip, c.value("hamiVnpuCore", false));
  absl::StatusOr<device::PodRequest> request = vendor->DecodeRequest(pod);
  absl::StatusOr<device::PodConstraints> constraints = vendor->DecodeConstraints(pod);
  if (!request.ok() || !constraints.ok()) {
    return "Tessera refuses the pod";
  }
  const device::GpuPolicy policy = constraints->gpu_policy.value_or(device::GpuPolicy{});
  const FitResult r = FitPod(SnapshotOf(c), *request, *constraints, policy);
  std::vector<std::string> uuids;
  for (const auto& ctr : r.devices) {
    for (const auto& d : ctr) {
      uuids.push_back(d.uuid);
    }
  }
  std::string mismatch;
  for (const json& a : h["answers"]) {
    std::vector<std::string> want;
    if (a.contains("uuids") && a["uuids"].is_array()) {
      want = a["uuids"].get<std::vector<std::string>>();
    }
    if (a["fit"].get<bool>() == r.fit && a["reason"].get<std::string>() == r.reason &&
        want == uuids) {
      return "";
    }
    mismatch = "HAMi " + a.dump();
  }
  std::string got;
  for (const auto& u : uuids) {
    got += u + " ";
  }
  return mismatch + "; Tessera fit=" + std::to_string(r.fit) + " reason=\"" + r.reason +
         "\" cards=" + got;
}

std::string CheckPatch(const json& c, const json& h) {
  const device::AscendChipConfig chip = Chip(c["chip"]);
  const device::PodDevices devices = PodDevicesOf(c);
  const device::AscendKeys keys = device::AscendKeysOf(chip.common_word);
  const json& a = h["annotations"];
  const std::string encoded = device::EncodePodDevices(devices);
  const std::string runtime = device::EncodeAscendRuntimeInfo(chip, devices, HamiCore(c));
  if (a.value(keys.to_allocate, "?") != encoded || a.value(keys.allocated, "?") != encoded) {
    return "allocation differs: Tessera " + encoded;
  }
  if (a.value(keys.runtime_info, "?") != runtime) {
    return "runtime info differs: Tessera " + runtime;
  }
  return a.size() == 3 ? "" : "HAMi wrote other annotations";
}

std::string CheckScore(const json& c, const json& h) {
  const device::AscendChipConfig chip = Chip(c["chip"]);
  const float score =
      device::AscendNetworkScore(chip.common_word, PodDevicesOf(c), *SnapshotOf(c).devices);
  const auto want = static_cast<float>(h["score"].get<double>());
  return score == want ? "" : "score differs: Tessera " + std::to_string(score);
}

std::string Check(const std::string& op, const json& c, const json& h) {
  if (op == "request") {
    return CheckRequest(c, h);
  }
  if (op == "admit") {
    return CheckAdmit(c, h);
  }
  if (op == "register") {
    return CheckRegister(c, h);
  }
  if (op == "fit") {
    return CheckFit(c, h);
  }
  if (op == "patch") {
    return CheckPatch(c, h);
  }
  if (op == "score") {
    return CheckScore(c, h);
  }
  return "unknown op";
}

TEST(AscendHamiTest, EveryCaseIsAnsweredAsHamiDoes) {
  const std::optional<std::vector<std::string>> lines = ReadLines(VectorsPath());
  ASSERT_TRUE(lines.has_value()) << "cannot read " << VectorsPath();
  std::map<std::string, int> per_op;
  int n = 0;
  int failures = 0;
  for (const std::string& line : *lines) {
    ++n;
    const json pair = json::parse(line);
    const json& c = pair["case"];
    const json& h = pair["hami"];
    ASSERT_FALSE(h.contains("bad")) << "line " << n << ": the oracle could not run it";
    const std::string op = c["op"];
    ++per_op[op];
    std::string why;
    try {
      why = Check(op, c, h);
    } catch (const json::exception& e) {
      why = std::string("malformed case or answer: ") + e.what();
    }
    if (!why.empty() && ++failures <= 20) {
      ADD_FAILURE() << "line " << n << " (" << op << "): " << why << "\n  case " << c.dump()
                    << "\n  HAMi " << h.dump();
    }
  }
  EXPECT_EQ(failures, 0);
  // A vacuous file proves nothing: every op must be there in numbers.
  for (const char* op : {"request", "admit", "register", "fit", "patch", "score"}) {
    EXPECT_GE(per_op[op], 20) << op;
  }
}

}  // namespace
}  // namespace tessera::schedule
