// Decode throughput of Kubernetes JSON: a 100,000-pod LIST body, watch events, and the watch
// frame splitter; plus the memory a decoded pod occupies.
//
//   cmake --preset release && cmake --build build/release --target decode_bench -j2
//   ./build/release/bench/decode_bench
#include <cstdint>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "fmt/format.h"
#include "simdjson.h"
#include <malloc.h>

#include "tessera/json/frame_splitter.h"
#include "tessera/kube/decode.h"

namespace tessera::kube {
namespace {

constexpr int kListPods = 100000;

// One pod in the shape the API server sends (compact JSON, ~4-5 KB): ownerReferences,
// managedFields with FieldsV1, a last-applied annotation, 1-2 containers with env, ports,
// resources and mounts, volumes, tolerations, affinity, conditions and containerStatuses.
std::string PodJson(int i, bool with_kind) {
  const int gpus = (i % 5 == 0) ? 0 : (1 << (i % 4));
  const std::string ns = fmt::format("team-{}", i % 37);
  const std::string name = fmt::format("job-{:06d}-worker-{}", i / 4, i % 4);
  const std::string uid = fmt::format("{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}", i * 2654435761u,
                                      i % 65536, i % 4096, (i * 7) % 4096, i * 11400714819ull);
  const std::string node = fmt::format("gpu-node-{:04d}", i % 5000);
  std::string labels = fmt::format(
      R"("app.kubernetes.io/name":"trainer","app.kubernetes.io/instance":"job-{0:06d}",)"
      R"("batch.kubernetes.io/job-name":"job-{0:06d}","controller-uid":"{1}",)"
      R"("pod-template-hash":"{2:x}","team":"team-{3}")",
      i / 4, uid, i * 31, i % 37);
  std::string annotations = fmt::format(
      R"("kubectl.kubernetes.io/last-applied-configuration":"{{\"apiVersion\":\"batch/v1\",)"
      R"(\"kind\":\"Job\",\"metadata\":{{\"annotations\":{{}},\"name\":\"job-{0:06d}\",)"
      R"(\"namespace\":\"{1}\"}},\"spec\":{{\"template\":{{\"spec\":{{\"containers\":[{{)"
      R"(\"image\":\"registry.example.com/ml/trainer:2.4.1\",\"name\":\"main\",\"resources\":)"
      R"({{\"limits\":{{\"nvidia.com/gpu\":\"{2}\",\"nvidia.com/gpumem\":\"8192\"}}}}}}],)"
      R"(\"restartPolicy\":\"Never\"}}}}}}}}\n","prometheus.io/scrape":"true",)"
      R"("prometheus.io/port":"9090")",
      i / 4, ns, gpus);
  if (i % 10 < 7) {
    annotations += fmt::format(
        R"(,"hami.io/vgpu-node":"{0}","hami.io/bind-phase":"success",)"
        R"("hami.io/vgpu-devices-allocated":"GPU-{1:08x}-2b4c-4f6e-9a1b-3c5d7e9f0a2b,NVIDIA,8192,)"
        R"(30:;","hami.io/bind-time":"17{2:08d}")",
        node, i, i);
  }
  std::string container = fmt::format(
      R"({{"name":"main","image":"registry.example.com/ml/trainer:2.4.1",)"
      R"("command":["python","-m","train"],"args":["--epochs","10","--shard","{0}"],)"
      R"("ports":[{{"name":"metrics","containerPort":9090,"protocol":"TCP"}}],)"
      R"("env":[{{"name":"RANK","value":"{0}"}},{{"name":"WORLD_SIZE","value":"4"}},)"
      R"({{"name":"POD_NAME","valueFrom":{{"fieldRef":{{"apiVersion":"v1",)"
      R"("fieldPath":"metadata.name"}}}}}}],)"
      R"("resources":{{"limits":{{"cpu":"8","memory":"32Gi","nvidia.com/gpu":"{1}",)"
      R"("nvidia.com/gpumem":8192}},"requests":{{"cpu":"4","memory":"16Gi",)"
      R"("nvidia.com/gpu":"{1}"}}}},"volumeMounts":[{{"name":"data","mountPath":"/data"}},)"
      R"({{"name":"kube-api-access-x","readOnly":true,)"
      R"("mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}}],)"
      R"("terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File",)"
      R"("imagePullPolicy":"IfNotPresent","securityContext":{{"privileged":false}}}})",
      i % 4, gpus);
  if (i % 3 == 0) {
    container +=
        R"(,{"name":"exporter","image":"registry.example.com/dcgm-exporter:3.3",)"
        R"("resources":{"limits":{"cpu":"100m","memory":"128Mi"}},)"
        R"("terminationMessagePath":"/dev/termination-log","imagePullPolicy":"IfNotPresent"})";
  }
  const char* phase = (i % 20 == 0) ? "Pending" : (i % 20 == 1 ? "Succeeded" : "Running");
  std::string json;
  json.reserve(6000);
  json += "{";
  if (with_kind) {
    json += R"("kind":"Pod","apiVersion":"v1",)";
  }
  json += fmt::format(
      R"("metadata":{{"name":"{0}","generateName":"job-{1:06d}-worker-","namespace":"{2}",)"
      R"("uid":"{3}","resourceVersion":"{4}","creationTimestamp":"2026-11-30T08:15:42Z",)"
      R"("labels":{{{5}}},"annotations":{{{6}}},)"
      R"("ownerReferences":[{{"apiVersion":"batch/v1","kind":"Job","name":"job-{1:06d}",)"
      R"("uid":"{3}","controller":true,"blockOwnerDeletion":true}}],)"
      R"("managedFields":[{{"manager":"kube-controller-manager","operation":"Update",)"
      R"("apiVersion":"v1","time":"2026-11-30T08:15:42Z","fieldsType":"FieldsV1","fieldsV1":)"
      R"({{"f:metadata":{{"f:generateName":{{}},"f:labels":{{".":{{}},)"
      R"("f:app.kubernetes.io/name":{{}},"f:batch.kubernetes.io/job-name":{{}},)"
      R"("f:controller-uid":{{}}}},"f:ownerReferences":{{".":{{}},"k:{{\"uid\":\"{3}\"}}":{{}}}}}},)"
      R"("f:spec":{{"f:containers":{{"k:{{\"name\":\"main\"}}":{{".":{{}},"f:args":{{}},)"
      R"("f:command":{{}},"f:env":{{}},"f:image":{{}},"f:name":{{}},"f:resources":{{".":{{}},)"
      R"("f:limits":{{}},"f:requests":{{}}}}}}}},"f:restartPolicy":{{}}}}}}}},)"
      R"({{"manager":"kubelet","operation":"Update","apiVersion":"v1",)"
      R"("time":"2026-11-30T08:16:01Z","fieldsType":"FieldsV1","fieldsV1":{{"f:status":)"
      R"({{"f:conditions":{{"k:{{\"type\":\"Ready\"}}":{{".":{{}},"f:lastProbeTime":{{}},)"
      R"("f:status":{{}}}}}},"f:containerStatuses":{{}},"f:phase":{{}},"f:podIP":{{}}}}}},)"
      R"("subresource":"status"}}]}},)",
      name, i / 4, ns, uid, 48000000 + i, labels, annotations);
  json += fmt::format(
      R"("spec":{{"volumes":[{{"name":"data","persistentVolumeClaim":{{"claimName":"ds"}}}},)"
      R"({{"name":"kube-api-access-x","projected":{{"sources":[{{"serviceAccountToken":)"
      R"({{"expirationSeconds":3607,"path":"token"}}}},{{"configMap":{{"name":"kube-root-ca.crt",)"
      R"("items":[{{"key":"ca.crt","path":"ca.crt"}}]}}}}],"defaultMode":420}}}}],)"
      R"("containers":[{0}],"restartPolicy":"Never","terminationGracePeriodSeconds":30,)"
      R"("dnsPolicy":"ClusterFirst","serviceAccountName":"default","serviceAccount":"default",)"
      R"({1}"schedulerName":"hami-scheduler","securityContext":{{}},)"
      R"("affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":)"
      R"({{"nodeSelectorTerms":[{{"matchExpressions":[{{"key":"gpu","operator":"In",)"
      R"("values":["on"]}}]}}]}}}}}},"tolerations":[{{"key":"node.kubernetes.io/not-ready",)"
      R"("operator":"Exists","effect":"NoExecute","tolerationSeconds":300}},)"
      R"({{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute",)"
      R"("tolerationSeconds":300}}],"priority":0,"enableServiceLinks":true,)"
      R"("preemptionPolicy":"PreemptLowerPriority"}},)",
      container, (i % 20 == 0) ? std::string() : fmt::format(R"("nodeName":"{}",)", node));
  json += fmt::format(
      R"("status":{{"phase":"{0}","conditions":[)"
      R"({{"type":"Initialized","status":"True","lastProbeTime":null,)"
      R"("lastTransitionTime":"2026-11-30T08:15:42Z"}},{{"type":"Ready","status":"True",)"
      R"("lastProbeTime":null,"lastTransitionTime":"2026-11-30T08:16:01Z"}},)"
      R"({{"type":"ContainersReady","status":"True","lastProbeTime":null,)"
      R"("lastTransitionTime":"2026-11-30T08:16:01Z"}},{{"type":"PodScheduled",)"
      R"("status":"True","lastProbeTime":null,"lastTransitionTime":"2026-11-30T08:15:42Z"}}],)"
      R"("hostIP":"10.0.{1}.{2}","podIP":"10.244.{1}.{2}","podIPs":[{{"ip":"10.244.{1}.{2}"}}],)"
      R"("startTime":"2026-11-30T08:15:42Z","containerStatuses":[{{"name":"main","state":)"
      R"({{"running":{{"startedAt":"2026-11-30T08:15:58Z"}}}},"lastState":{{}},"ready":true,)"
      R"("restartCount":0,"image":"registry.example.com/ml/trainer:2.4.1",)"
      R"("imageID":"registry.example.com/ml/trainer@sha256:9f2e{3:060x}",)"
      R"("containerID":"containerd://{3:064x}","started":true}}],"qosClass":"Burstable"}}}})",
      phase, (i / 250) % 250, i % 250, i);
  return json;
}

// A lean pod: what a Deployment-managed GPU pod looks like to the scheduler after Tessera bound
// it (two labels, the HAMi annotations, one container with GPU limits).
std::string LeanPodJson(int i) {
  return fmt::format(
      R"({{"metadata":{{"name":"infer-{0:05d}","namespace":"serving","uid":"{1:08x}-0000-4000-)"
      R"(8000-{0:012d}","resourceVersion":"{2}","creationTimestamp":"2026-11-30T08:15:42Z",)"
      R"("labels":{{"app":"infer","pod-template-hash":"7d9f8c6b5"}},"annotations":{{)"
      R"("hami.io/vgpu-node":"gpu-node-{3:04d}","hami.io/vgpu-devices-allocated":"GPU-{1:08x},)"
      R"(NVIDIA,8192,30:;","hami.io/bind-phase":"success"}}}},"spec":{{"containers":[{{)"
      R"("name":"server","resources":{{"limits":{{"nvidia.com/gpu":"1","nvidia.com/gpumem":)"
      R"("8192"}},"requests":{{"cpu":"2","memory":"8Gi"}}}}}}],"nodeName":"gpu-node-{3:04d}",)"
      R"("schedulerName":"hami-scheduler"}},"status":{{"phase":"Running"}}}})",
      i, i * 2654435761u, 48000000 + i, i % 5000);
}

const std::string& ListBody() {
  static const std::string* body = [] {
    auto* s = new std::string();
    s->reserve(size_t{kListPods} * 5200);
    *s += R"({"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"48213400"},)";
    *s += R"("items":[)";
    for (int i = 0; i < kListPods; ++i) {
      if (i > 0) {
        *s += ',';
      }
      *s += PodJson(i, false);
    }
    *s += "]}";
    return s;
  }();
  return *body;
}

const std::vector<std::string>& WatchEvents() {
  static const std::vector<std::string>* events = [] {
    auto* v = new std::vector<std::string>();
    for (int i = 0; i < 10000; ++i) {
      v->push_back(R"({"type":"MODIFIED","object":)" + PodJson(i, true) + "}");
    }
    return v;
  }();
  return *events;
}

// Heap bytes held by a string beyond its inline buffer.
size_t HeapOf(const std::string& s) { return s.capacity() > 15 ? s.capacity() + 1 : 0; }
// Keys are interned (one copy per process), so an entry's key costs nothing per object.
size_t HeapOf(const ShortString& s) { return s.size() > 15 ? s.size() : 0; }
template <typename V>
size_t HeapOf(const BasicStringMap<V>& m) {
  size_t n = m.size() * sizeof(typename BasicStringMap<V>::Entry);
  for (const auto& [k, v] : m) {
    n += HeapOf(v);
  }
  return n;
}

void BM_DecodePodList100k(benchmark::State& state) {
  const std::string& body = ListBody();
  // One decoder for all runs, warmed up once: the parser's buffers are sized by the first call,
  // as they are after the first page of a relist.
  static Decoder* decoder = new Decoder(/*retain_bytes=*/size_t{4} << 30);
  static std::string* copy = new std::string(body);
  const bool in_place = state.range(0) != 0;
  size_t pods = 0;
  if (!decoder->DecodePodListInPlace(copy).ok()) {
    state.SkipWithError("decode failed");
    return;
  }
  for (auto _ : state) {
    absl::StatusOr<PodList> list =
        in_place ? decoder->DecodePodListInPlace(copy) : decoder->DecodePodList(body);
    if (!list.ok()) {
      state.SkipWithError(std::string(list.status().message()).c_str());
      return;
    }
    pods = list->items.size();
    benchmark::DoNotOptimize(list->items.data());
    state.PauseTiming();  // freeing the result is not part of the decode
    list = absl::StatusOr<PodList>();
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * body.size()));
  state.counters["pods"] = static_cast<double>(pods);
  state.counters["bytes_per_pod"] = static_cast<double>(body.size()) / kListPods;
}
BENCHMARK(BM_DecodePodList100k)
    ->ArgName("in_place")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3);

// The same 100,000 pods as a reflector reads them: 200 pages of 500 (limit=500), each page its
// own body, decoded one after the other by one Decoder.
void BM_DecodePodListPaged(benchmark::State& state) {
  static std::vector<std::string>* pages = [] {
    auto* v = new std::vector<std::string>();
    for (int p = 0; p < kListPods / 500; ++p) {
      std::string page = fmt::format(
          R"({{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"48213400",)"
          R"("continue":"eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NDgyMTM0MDAsInN0YXJ0Ijoi{}"}},)"
          R"("items":[)",
          p);
      for (int i = p * 500; i < (p + 1) * 500; ++i) {
        page += (i > p * 500 ? "," : "") + PodJson(i, false);
      }
      page += "]}";
      v->push_back(std::move(page));
    }
    return v;
  }();
  Decoder decoder;
  size_t bytes = 0;
  for (const std::string& page : *pages) {
    bytes += page.size();
  }
  std::vector<PodList> results(pages->size());
  for (auto _ : state) {
    for (size_t p = 0; p < pages->size(); ++p) {
      absl::StatusOr<PodList> list = decoder.DecodePodList((*pages)[p]);
      if (!list.ok()) {
        state.SkipWithError("decode failed");
        return;
      }
      results[p] = *std::move(list);
    }
    state.PauseTiming();
    for (PodList& r : results) {
      r = PodList();
    }
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["pods_per_second"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * kListPods, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecodePodListPaged)->Unit(benchmark::kMillisecond)->MinTime(3);

// The ceiling on this machine: simdjson On-Demand walking every pod's top-level keys, with no
// extraction. The decoder's throughput is judged against this, measured in the same run.
void BM_ParseOnlyCeiling(benchmark::State& state) {
  simdjson::padded_string body(ListBody());
  simdjson::ondemand::parser parser;
  size_t keys = 0;
  for (auto _ : state) {
    simdjson::ondemand::document doc;
    simdjson::ondemand::object list;
    if (parser.iterate(body).get(doc) || doc.get_object().get(list)) {
      state.SkipWithError("parse failed");
      return;
    }
    for (auto field : list) {
      simdjson::ondemand::field f;
      std::string_view key;
      if (std::move(field).get(f) || f.unescaped_key().get(key)) {
        state.SkipWithError("parse failed");
        return;
      }
      if (key != "items") {
        continue;
      }
      simdjson::ondemand::array items;
      if (f.value().get_array().get(items)) {
        state.SkipWithError("parse failed");
        return;
      }
      for (auto item : items) {
        simdjson::ondemand::object pod;
        if (std::move(item).get_object().get(pod)) {
          state.SkipWithError("parse failed");
          return;
        }
        for (auto pf : pod) {
          simdjson::ondemand::field x;
          std::string_view k;
          if (std::move(pf).get(x) || x.unescaped_key().get(k)) {
            state.SkipWithError("parse failed");
            return;
          }
          keys += k.size();
        }
      }
    }
    benchmark::DoNotOptimize(keys);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * body.size()));
}
BENCHMARK(BM_ParseOnlyCeiling)->Unit(benchmark::kMillisecond)->MinTime(3);

// Memory of the decoded projections: malloc's in-use bytes (chunk overhead included) for the
// whole list, per pod, and the same without annotation values (structural count).
void BM_PodMemory(benchmark::State& state) {
  std::string lean;
  if (state.range(0) == 1) {
    lean = R"({"kind":"PodList","metadata":{},"items":[)";
    for (int i = 0; i < kListPods; ++i) {
      lean += (i > 0 ? "," : "") + LeanPodJson(i);
    }
    lean += "]}";
  }
  const std::string& body = state.range(0) == 1 ? lean : ListBody();
  Decoder decoder;
  for (auto _ : state) {
    struct mallinfo2 before = mallinfo2();
    absl::StatusOr<PodList> list = decoder.DecodePodList(body);
    struct mallinfo2 after = mallinfo2();
    if (!list.ok()) {
      state.SkipWithError("decode failed");
      return;
    }
    size_t annotation_values = 0;
    size_t structural = 0;
    for (const Pod& p : list->items) {
      for (const auto& [k, v] : p.meta.annotations) {
        annotation_values += HeapOf(v);
      }
      structural += sizeof(Pod) + HeapOf(p.meta.uid) + HeapOf(p.meta.ns) + HeapOf(p.meta.name) +
                    HeapOf(p.meta.resource_version) + HeapOf(p.meta.labels) +
                    HeapOf(p.meta.annotations) + HeapOf(p.node_name) + HeapOf(p.scheduler_name);
      for (const auto* cs : {&p.containers, &p.init_containers}) {
        structural += cs->capacity() * sizeof(Container);
        for (const Container& c : *cs) {
          structural += HeapOf(c.name) + HeapOf(c.limits) + HeapOf(c.requests);
        }
      }
    }
    const double n = static_cast<double>(list->items.size());
    state.counters["sizeof_Pod"] = sizeof(Pod);
    state.counters["sizeof_Container"] = sizeof(Container);
    state.counters["malloc_B_per_pod"] = static_cast<double>(after.uordblks - before.uordblks) / n;
    state.counters["counted_B_per_pod"] = static_cast<double>(structural) / n;
    state.counters["counted_B_per_pod_excl_annotation_values"] =
        static_cast<double>(structural - annotation_values) / n;
  }
}
BENCHMARK(BM_PodMemory)
    ->ArgName("lean")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

void BM_DecodeWatchEvent(benchmark::State& state) {
  const std::vector<std::string>& events = WatchEvents();
  Decoder decoder;
  size_t i = 0;
  size_t bytes = 0;
  for (auto _ : state) {
    const std::string& e = events[i++ % events.size()];
    auto event = decoder.DecodeWatchEvent<Pod>(e);
    if (!event.ok()) {
      state.SkipWithError("decode failed");
      return;
    }
    bytes += e.size();
    benchmark::DoNotOptimize(event->object.meta.name.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_DecodeWatchEvent);

void BM_FrameSplitter(benchmark::State& state) {
  std::string stream;
  for (const std::string& e : WatchEvents()) {
    stream += e;
    stream += '\n';
  }
  const size_t chunk = static_cast<size_t>(state.range(0));
  size_t frames_seen = 0;
  for (auto _ : state) {
    json::FrameSplitter splitter;
    std::vector<std::string> frames;
    frames_seen = 0;
    for (size_t pos = 0; pos < stream.size(); pos += chunk) {
      if (!splitter.Feed(std::string_view(stream).substr(pos, chunk), &frames).ok()) {
        state.SkipWithError("split failed");
        return;
      }
      frames_seen += frames.size();
      frames.clear();  // a watch consumer decodes the frames of a chunk and drops them
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * stream.size()));
  state.counters["frames"] = static_cast<double>(frames_seen);
}
BENCHMARK(BM_FrameSplitter)->Arg(16 << 10)->Unit(benchmark::kMillisecond);

// Watch ingest without the apply step: a stream of 10,000 MODIFIED events (~5 KB each) arriving
// in 16 KiB chunks, split into frames and decoded.
void BM_WatchIngest(benchmark::State& state) {
  std::string stream;
  for (const std::string& e : WatchEvents()) {
    stream += e;
    stream += '\n';
  }
  constexpr size_t kChunk = 16 << 10;
  Decoder decoder;
  size_t events = 0;
  for (auto _ : state) {
    json::FrameSplitter splitter;
    std::vector<std::string> frames;
    for (size_t pos = 0; pos < stream.size(); pos += kChunk) {
      if (!splitter.Feed(std::string_view(stream).substr(pos, kChunk), &frames).ok()) {
        state.SkipWithError("split failed");
        return;
      }
      for (const std::string& frame : frames) {
        auto event = decoder.DecodeWatchEvent<Pod>(frame);
        if (!event.ok()) {
          state.SkipWithError("decode failed");
          return;
        }
        benchmark::DoNotOptimize(event->object.meta.name.data());
        ++events;
      }
      frames.clear();
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * stream.size()));
  state.counters["events_per_second"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_WatchIngest)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera::kube
