// SummaryTable, SummaryJson and ReportHtml of simulation.h.
#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/sim/simulation.h"

namespace tessera::sim {
namespace {

std::string Secs(absl::Duration d) { return fmt::format("{:.1f} s", absl::ToDoubleSeconds(d)); }
std::string Ms(absl::Duration d) { return fmt::format("{:.2f} ms", absl::ToDoubleMilliseconds(d)); }

const Divergence* Longest(const RunResult& r, absl::Time end) {
  const Divergence* best = nullptr;
  for (const Divergence& d : r.divergences) {
    if (best == nullptr || d.Length(end) > best->Length(end)) best = &d;
  }
  return best;
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

std::string SummaryTable(const RunResult& r) {
  const absl::Time end = r.start + r.elapsed;
  std::string out;
  auto row = [&](const std::string& k, const std::string& v) {
    out += fmt::format("  {:<30} {}\n", k, v);
  };
  out += fmt::format("tessera simulate: scenario {} (seed {}), {} nodes, {} GPUs, {} + drain\n",
                     r.scenario, r.seed, r.nodes, r.gpus, Secs(r.duration));
  row("pods created", std::to_string(r.created));
  row("pods scheduled", std::to_string(r.scheduled));
  row("pods unschedulable (once+)", fmt::format("{} ({} filter answers without a node)",
                                                r.unschedulable, r.unschedulable_attempts));
  row("pods deleted", fmt::format("{} ({} ran to completion)", r.deleted, r.completed));
  row("device plugin allocations", std::to_string(r.allocations));
  row("filter latency p50 / p99", Ms(r.filter_p50) + " / " + Ms(r.filter_p99));
  row("filter errors / bind refusals", fmt::format("{} / {}", r.filter_errors, r.bind_errors));
  row("full-Nodes filters", std::to_string(r.full_nodes_filters));
  std::string kinds;
  {
    std::map<std::string, int> by;
    for (const FaultRecord& f : r.faults) ++by[f.kind];
    for (const auto& [k, n] : by) kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", n, k);
  }
  row("faults injected",
      fmt::format("{}{}", r.faults.size(), kinds.empty() ? "" : " (" + kinds + ")"));
  row("oracle samples (compared)", fmt::format("{} ({})", r.observations, r.compared));
  const Divergence* longest = Longest(r, end);
  const size_t shares =
      static_cast<size_t>(std::count_if(r.divergences.begin(), r.divergences.end(),
                                        [](const Divergence& d) { return !d.pod.empty(); }));
  row("divergences", fmt::format("{} lasting 2+ samples ({} devices, {} pod shares), {} transient",
                                 r.divergences.size(), r.divergences.size() - shares, shares,
                                 r.transient_divergences));
  if (longest != nullptr) {
    row("longest divergence",
        fmt::format("{} on {} ({}), cause {}{}", Secs(longest->Length(end)), Subject(*longest),
                    longest->node, longest->cause,
                    longest->end == absl::InfiniteFuture()
                        ? (longest->violation ? ", NOT HEALED" : ", still open at the end")
                        : ""));
  }
  row("invariant violations", std::to_string(r.violations.size()));
  for (size_t i = 0; i < r.violations.size() && i < 10; ++i) {
    out += fmt::format("    at {}: {}\n", Secs(r.violations[i].at - r.start), r.violations[i].what);
  }
  out += r.violations.empty() ? "verdict: PASS\n" : "verdict: FAIL\n";
  return out;
}

std::string SummaryJson(const RunResult& r) {
  using nlohmann::json;
  const absl::Time end = r.start + r.elapsed;
  json j = {{"scenario", r.scenario},
            {"seed", r.seed},
            {"scheduler_args", r.scheduler_args},
            {"nodes", r.nodes},
            {"gpus", r.gpus},
            {"duration_s", absl::ToDoubleSeconds(r.duration)},
            {"elapsed_s", absl::ToDoubleSeconds(r.elapsed)},
            {"pods",
             {{"created", r.created},
              {"scheduled", r.scheduled},
              {"unschedulable", r.unschedulable},
              {"unschedulable_attempts", r.unschedulable_attempts},
              {"deleted", r.deleted},
              {"completed", r.completed},
              {"allocations", r.allocations}}},
            {"filter",
             {{"p50_ms", absl::ToDoubleMilliseconds(r.filter_p50)},
              {"p99_ms", absl::ToDoubleMilliseconds(r.filter_p99)},
              {"errors", r.filter_errors},
              {"full_nodes", r.full_nodes_filters}}},
            {"bind_errors", r.bind_errors},
            {"observations", r.observations},
            {"compared", r.compared},
            {"transient_divergences", r.transient_divergences},
            {"passed", r.violations.empty()}};
  json faults = json::array();
  for (const FaultRecord& f : r.faults) {
    faults.push_back(
        {{"at_s", absl::ToDoubleSeconds(f.at)}, {"kind", f.kind}, {"detail", f.detail}});
  }
  j["faults"] = faults;
  json divs = json::array();
  for (const Divergence& d : r.divergences) {
    divs.push_back(
        {{"device", d.device},
         {"pod", d.pod.empty() ? json(nullptr) : json(d.pod)},
         {"node", d.node},
         {"start_s", absl::ToDoubleSeconds(d.start - r.start)},
         {"end_s", d.end == absl::InfiniteFuture() ? json(nullptr)
                                                   : json(absl::ToDoubleSeconds(d.end - r.start))},
         {"length_s", absl::ToDoubleSeconds(d.Length(end))},
         {"cause", d.cause},
         {"detail", d.detail},
         {"violation", d.violation}});
  }
  j["divergences"] = divs;
  json vio = json::array();
  for (const Violation& v : r.violations) {
    vio.push_back({{"at_s", absl::ToDoubleSeconds(v.at - r.start)}, {"what", v.what}});
  }
  j["violations"] = vio;
  json samples = json::array();
  for (const Sample& s : r.samples) {
    samples.push_back({absl::ToDoubleSeconds(s.at), s.truth_mib, s.exported_mib, s.diverging,
                       s.live_pods, s.diverging_shares});
  }
  j["samples_columns"] = {"t_s",  "truth_mib",           "exported_mib", "diverging_devices",
                          "pods", "diverging_pod_shares"};
  j["samples"] = samples;
  return j.dump(2) + "\n";
}

std::string ReportHtml(const RunResult& r) {
  const absl::Time end = r.start + r.elapsed;
  const double W = 1000, H = 360, L = 70, R = 20, T = 20, B = 40;
  double tmax = 1;
  double ymax = 1;
  for (const Sample& s : r.samples) {
    tmax = std::max(tmax, absl::ToDoubleSeconds(s.at));
    ymax = std::max({ymax, static_cast<double>(s.truth_mib), static_cast<double>(s.exported_mib)});
  }
  // A round GiB step for the y axis: 1, 2 or 5 × 10^k, about five lines.
  double step_gib = 1;
  while (ymax / 1024 / step_gib > 5) {
    const double m = step_gib / std::pow(10.0, std::floor(std::log10(step_gib)));
    step_gib *= m == 2 ? 2.5 : 2;
  }
  const int ylines = static_cast<int>(std::ceil(ymax / 1024 / step_gib));
  ymax = std::max(1.0, ylines * step_gib * 1024);
  auto x = [&](double t) { return L + (W - L - R) * std::min(t, tmax) / tmax; };
  auto y = [&](double v) { return T + (H - T - B) * (1 - v / ymax); };
  std::string svg = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {} {}' width='100%'>\n", W, H);
  // axes and grid
  for (int i = 0; i <= ylines; ++i) {
    const double v = i * step_gib * 1024;
    svg += fmt::format(
        "<line x1='{}' x2='{}' y1='{:.1f}' y2='{:.1f}' stroke='#e5e5e5'/>"
        "<text x='{}' y='{:.1f}' font-size='11' text-anchor='end' fill='#555'>{:.0f} GiB</text>\n",
        L, W - R, y(v), y(v), L - 6, y(v) + 4, v / 1024);
  }
  const int step = tmax > 120 ? 30 : (tmax > 40 ? 10 : 5);
  for (int t = 0; t <= static_cast<int>(tmax); t += step) {
    svg += fmt::format(
        "<text x='{:.1f}' y='{}' font-size='11' text-anchor='middle' fill='#555'>{}s</text>\n",
        x(t), H - B + 16, t);
  }
  svg +=
      fmt::format("<line x1='{}' x2='{}' y1='{}' y2='{}' stroke='#333'/>", L, W - R, H - B, H - B);
  svg += fmt::format("<line x1='{}' x2='{}' y1='{}' y2='{}' stroke='#333'/>\n", L, L, T, H - B);
  // drain region
  const double drain_x = x(absl::ToDoubleSeconds(r.duration));
  svg += fmt::format(
      "<rect x='{:.1f}' y='{}' width='{:.1f}' height='{}' fill='#f4f4f4'/>"
      "<text x='{:.1f}' y='{}' font-size='11' fill='#777'>drain</text>\n",
      drain_x, T, std::max(0.0, W - R - drain_x), H - T - B, drain_x + 4, T + 12);
  // divergence spans
  for (const Divergence& d : r.divergences) {
    const double a = absl::ToDoubleSeconds(d.start - r.start);
    const double b =
        absl::ToDoubleSeconds((d.end == absl::InfiniteFuture() ? end : d.end) - r.start);
    svg += fmt::format(
        "<rect x='{:.1f}' y='{}' width='{:.1f}' height='6' fill='{}' opacity='0.6'>"
        "<title>{} {}: {}</title></rect>\n",
        x(a), H - B - 6, std::max(1.5, x(b) - x(a)), d.violation ? "#d62728" : "#ff9f1c",
        Escape(Subject(d)), Escape(d.cause), Escape(d.detail));
  }
  // fault markers
  for (const FaultRecord& f : r.faults) {
    const double fx = x(absl::ToDoubleSeconds(f.at));
    svg += fmt::format(
        "<line x1='{0:.1f}' x2='{0:.1f}' y1='{1}' y2='{2}' stroke='#9467bd' "
        "stroke-dasharray='4 3'><title>{3}: {4}</title></line>"
        "<text x='{5:.1f}' y='{6}' font-size='10' fill='#9467bd' "
        "transform='rotate(-90 {5:.1f} {6})' text-anchor='end'>{3}</text>\n",
        fx, T, H - B, Escape(f.kind), Escape(f.detail), fx + 3, T + 2);
  }
  auto polyline = [&](bool exported, const char* color, const char* dash) {
    std::string pts;
    std::string out;
    for (const Sample& s : r.samples) {
      const int64_t v = exported ? s.exported_mib : s.truth_mib;
      if (v < 0) {  // a gap: Tessera's /metrics was not readable
        if (!pts.empty()) {
          out +=
              fmt::format("<polyline fill='none' stroke='{}' stroke-width='2' {} points='{}'/>\n",
                          color, dash, pts);
        }
        pts.clear();
        continue;
      }
      pts +=
          fmt::format("{:.1f},{:.1f} ", x(absl::ToDoubleSeconds(s.at)), y(static_cast<double>(v)));
    }
    if (!pts.empty()) {
      out += fmt::format("<polyline fill='none' stroke='{}' stroke-width='2' {} points='{}'/>\n",
                         color, dash, pts);
    }
    return out;
  };
  svg += polyline(false, "#1f77b4", "");
  svg += polyline(true, "#ff7f0e", "stroke-dasharray='6 4'");
  svg += "</svg>\n";

  std::string html =
      "<!doctype html>\n<html><head><meta charset='utf-8'><title>tessera simulate: " +
      Escape(r.scenario) +
      "</title>\n<style>"
      "body{font-family:sans-serif;margin:24px;color:#222;max-width:1100px}"
      "table{border-collapse:collapse;margin:8px 0 20px}"
      "td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;font-size:13px}"
      "th{background:#f6f6f6}.pass{color:#2ca02c}.fail{color:#d62728}"
      ".legend span{display:inline-block;margin-right:18px;font-size:13px}"
      ".sw{display:inline-block;width:24px;height:3px;vertical-align:middle;margin-right:6px}"
      "pre{background:#f6f6f6;padding:10px;font-size:12px;white-space:pre-wrap}"
      "</style></head><body>\n";
  html +=
      fmt::format("<h1>tessera simulate — {} <span class='{}'>{}</span></h1>\n", Escape(r.scenario),
                  r.violations.empty() ? "pass" : "fail", r.violations.empty() ? "PASS" : "FAIL");
  html += fmt::format(
      "<p>seed {}, {} nodes, {} GPUs, workload {} then drain; scheduler args: "
      "<code>{}</code></p>\n",
      r.seed, r.nodes, r.gpus, Secs(r.duration),
      r.scheduler_args.empty() ? "(defaults)" : Escape(r.scheduler_args));
  html +=
      "<h2>Allocated GPU memory, whole cluster</h2>\n<div class='legend'>"
      "<span><i class='sw' style='background:#1f77b4'></i>truth (from the API server's pods)</span>"
      "<span><i class='sw' style='background:#ff7f0e'></i>exported by Tessera "
      "(hami_gpu_memory_allocated_bytes)</span>"
      "<span><i class='sw' style='background:#9467bd'></i>fault</span>"
      "<span><i class='sw' style='background:#ff9f1c'></i>divergence (healed)</span>"
      "<span><i class='sw' style='background:#d62728'></i>divergence (violation)</span></div>\n";
  html += svg;
  html += "<h2>Summary</h2>\n<pre>" + Escape(SummaryTable(r)) + "</pre>\n";
  html += "<h2>Faults</h2>\n<table><tr><th>at</th><th>fault</th><th>detail</th></tr>\n";
  for (const FaultRecord& f : r.faults) {
    html += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>\n", Secs(f.at), Escape(f.kind),
                        Escape(f.detail));
  }
  html +=
      "</table>\n<h2>Divergences (2+ samples)</h2>\n<table><tr><th>start</th><th>end</th>"
      "<th>length</th><th>device</th><th>pod</th><th>node</th><th>cause</th><th>at its start</th>"
      "</tr>\n";
  for (const Divergence& d : r.divergences) {
    html += fmt::format(
        "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td></tr>\n",
        d.violation ? " class='fail'" : "", Secs(d.start - r.start),
        d.end == absl::InfiniteFuture() ? "open" : Secs(d.end - r.start), Secs(d.Length(end)),
        Escape(d.device), d.pod.empty() ? "(device)" : Escape(d.pod), Escape(d.node),
        Escape(d.cause), Escape(d.detail));
  }
  html += "</table>\n</body></html>\n";
  return html;
}

}  // namespace tessera::sim
