// SummaryTable, SummaryJson and ReportHtml of simulation.h.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

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
    if (best == nullptr || d.Length(end) > best->Length(end)) {
      best = &d;
    }
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

int64_t OutlivedWindow(const RunResult& r) {
  return std::count_if(r.divergences.begin(), r.divergences.end(),
                       [](const Divergence& d) { return d.violation; });
}

int64_t OverCommits(const RunResult& r) {
  return std::count_if(r.violations.begin(), r.violations.end(),
                       [](const Violation& v) { return v.overcommit; });
}

RepairWaits ComputeRepairWaits(const std::vector<Divergence>& divergences,
                               const std::vector<std::pair<absl::Time, absl::Time>>& transient,
                               const std::vector<PodTimes>& pods, absl::Duration sampling) {
  // The spans of a fault's divergences (from the observation before each was seen); one in
  // flight is no fault's.
  std::vector<std::pair<absl::Time, absl::Time>> spans;
  for (const Divergence& d : divergences) {
    if (!d.cause.empty() && d.cause != "in-flight") {
      spans.emplace_back(d.start - sampling, d.end);
    }
  }
  for (const auto& [start, end] : transient) {
    spans.emplace_back(start - sampling, end);
  }
  std::sort(spans.begin(), spans.end());
  // A period begins with the first span; what the fault broke is what was seen within two
  // samples of it, and the period ends when all of that healed (the repair). Spans that begin
  // later within the period are differences the oracle credits to the same fault (the window)
  // while pods are in flight after the repair: they neither extend it nor begin another.
  struct Period {
    absl::Time start, first_heal, end;  // first_heal: the first of the fault's spans healed
  };
  std::vector<Period> periods;
  for (const auto& [start, end] : spans) {
    if (!periods.empty() && start <= periods.back().end) {
      if (start <= periods.back().start + 2 * sampling) {
        periods.back().first_heal = std::min(periods.back().first_heal, end);
        periods.back().end = std::max(periods.back().end, end);
      }
      continue;
    }
    periods.push_back({start, end, end});
  }
  RepairWaits out;
  for (const PodTimes& pod : pods) {
    if (pod.refused == absl::InfiniteFuture()) {
      continue;
    }
    for (const Period& p : periods) {
      if (pod.refused > p.end || pod.created > p.end || pod.bound <= p.start) {
        continue;  // not refused and pending while this one was open
      }
      if (pod.gone_unbound) {
        break;
      }
      ++out.refused_while_wrong;
      // The repair began after the observation before the first heal was seen.
      const absl::Time repair =
          p.first_heal == absl::InfiniteFuture() ? p.first_heal : p.first_heal - sampling;
      if (pod.bound == absl::InfiniteFuture()) {
        ++out.still_pending;
      } else if (pod.bound <= repair) {
        ++out.bound_before_repair;
      } else {
        out.seconds.push_back(absl::ToDoubleSeconds(pod.bound - repair));
      }
      break;
    }
  }
  std::sort(out.seconds.begin(), out.seconds.end());
  return out;
}

RequeueWrites ComputeRequeueWrites(const std::vector<Sample>& samples) {
  RequeueWrites out;
  const Sample* last = nullptr;
  for (const Sample& s : samples) {
    if (s.requeued < 0) {
      continue;
    }
    out.total = std::max(out.total, s.requeued);
    if (last != nullptr && s.at > last->at && s.requeued > last->requeued) {
      out.peak_per_second =
          std::max(out.peak_per_second, static_cast<double>(s.requeued - last->requeued) /
                                            absl::ToDoubleSeconds(s.at - last->at));
    }
    last = &s;
  }
  return out;
}

bool Succeeded(const RunResult& primary, const RunResult* comparison) {
  return primary.violations.empty() && (comparison == nullptr || OverCommits(*comparison) == 0);
}

namespace {

using Rows = std::vector<std::pair<std::string, std::string>>;

// Divergences of pod shares (not devices); with `outlived_only` those past the window.
size_t PodShareDivergences(const RunResult& r, bool outlived_only) {
  return static_cast<size_t>(std::count_if(
      r.divergences.begin(), r.divergences.end(),
      [&](const Divergence& d) { return !d.pod.empty() && (d.violation || !outlived_only); }));
}

// The figures of a run, in the order of the summary table. `compact`: values short enough for
// two columns side by side (the longest divergence's device then goes below the table).
Rows Figures(const RunResult& r, bool compact) {
  const absl::Time end = r.start + r.elapsed;
  Rows rows;
  auto row = [&](std::string k, std::string v) { rows.emplace_back(std::move(k), std::move(v)); };
  row("control plane", r.control_plane == "real"
                           ? (compact ? "real" : "real (etcd, kube-apiserver, kube-scheduler)")
                           : (compact ? "apisim" : "apisim (kube-scheduler emulated)"));
  row("scheduler under test", r.scheduler);
  row("pods created", std::to_string(r.created));
  row("pods scheduled", std::to_string(r.scheduled));
  row("pods unschedulable (once+)",
      compact ? fmt::format("{} ({} answers)", r.unschedulable, r.unschedulable_attempts)
              : fmt::format("{} ({} filter answers without a node)", r.unschedulable,
                            r.unschedulable_attempts));
  if (r.quota_refusals > 0) {
    row("refused by a namespace quota", fmt::format("{} filter answers", r.quota_refusals));
  }
  if (r.mig_pods > 0 || r.mig_refusals > 0) {
    row("MIG pods placed",
        fmt::format("{} ({} instances realised by the plugins)", r.mig_pods, r.mig_instances));
    row("MIG refusals",
        fmt::format("{} filter answers with CardMigTopologyInfeasible", r.mig_refusals));
  }
  if (r.preemption.has_value()) {
    const PreemptionFindings& p = *r.preemption;
    row("preemptions", compact ? fmt::format("{} ({} victims)", p.preemptions, p.victims)
                               : fmt::format("{} ({} victims evicted; {} evictions unattributed)",
                                             p.preemptions, p.victims, p.unattributed));
    row("preemptions judged",
        compact
            ? fmt::format("{} of {}", p.judged, p.preemptions)
            : fmt::format("{} (not judged: {} node changed, {} nomination held, {} request "
                          "not modelled)",
                          p.judged, p.unjudged_changed, p.unjudged_nominated, p.unjudged_request));
    row("preemptors bound", fmt::format("{} on the freed node, {} elsewhere, {} never",
                                        p.bound_there, p.bound_elsewhere, p.never_bound));
  }
  row("pods deleted", fmt::format("{} ({} ran to completion)", r.deleted, r.completed));
  row("device plugin allocations", std::to_string(r.allocations));
  if (r.control_plane == "real") {
    // kube-scheduler calls the extender; its latencies are not seen here.
    row("filter latency p50 / p99", "n/a (kube-scheduler's calls)");
  } else {
    row("filter latency p50 / p99", Ms(r.filter_p50) + " / " + Ms(r.filter_p99));
    row("filter errors / bind refusals", fmt::format("{} / {}", r.filter_errors, r.bind_errors));
    row("full-Nodes filters", std::to_string(r.full_nodes_filters));
  }
  std::string kinds;
  {
    std::map<std::string, int> by;
    for (const FaultRecord& f : r.faults) {
      ++by[f.kind];
    }
    for (const auto& [k, n] : by) {
      kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", n, k);
    }
  }
  row("faults injected",
      fmt::format("{}{}", r.faults.size(), kinds.empty() ? "" : " (" + kinds + ")"));
  if (!r.skipped_faults.empty()) {
    std::map<std::string, int> by;
    for (const FaultRecord& f : r.skipped_faults) {
      ++by[f.kind];
    }
    std::string skipped;
    for (const auto& [k, n] : by) {
      skipped += fmt::format("{}{} {}", skipped.empty() ? "" : ", ", n, k);
    }
    row("faults skipped", fmt::format("{} ({}: apisim only)", r.skipped_faults.size(), skipped));
  }
  row("oracle samples (compared)", fmt::format("{} ({})", r.observations, r.compared));
  const size_t shares = PodShareDivergences(r, false);
  if (compact) {
    row("divergences (devices / pods)",
        fmt::format("{} ({} / {})", r.divergences.size(), r.divergences.size() - shares, shares));
    row("transient differences", std::to_string(r.transient_divergences));
  } else {
    row("divergences",
        fmt::format("{} lasting 2+ samples ({} devices, {} pod shares), {} transient",
                    r.divergences.size(), r.divergences.size() - shares, shares,
                    r.transient_divergences));
  }
  if (const Divergence* longest = Longest(r, end); longest != nullptr) {
    const std::string open = longest->end == absl::InfiniteFuture()
                                 ? (longest->violation ? ", NOT HEALED" : ", still open at the end")
                                 : "";
    row("longest divergence",
        compact ? Secs(longest->Length(end)) + open
                : fmt::format("{} on {} ({}), cause {}{}", Secs(longest->Length(end)),
                              Subject(*longest), longest->node, longest->cause, open));
  } else {
    row("longest divergence", "none");
  }
  if (const RepairWaits& w = r.repair_waits; w.refused_while_wrong > 0) {
    std::string after = "none";
    if (!w.seconds.empty()) {
      after =
          fmt::format("{}, median {:.1f} s, max {:.1f} s{}", w.seconds.size(),
                      (w.seconds[(w.seconds.size() - 1) / 2] + w.seconds[w.seconds.size() / 2]) / 2,
                      w.seconds.back(), compact ? "" : " (at most)");
    }
    row("refused while wrong", std::to_string(w.refused_while_wrong));
    row("  bound after the repair", after);
    row("  bound before it / pending",
        fmt::format("{} / {}", w.bound_before_repair, w.still_pending));
  }
  if (const RequeueWrites q = ComputeRequeueWrites(r.samples); q.total > 0) {
    row("requeue writes (Tessera)",
        fmt::format("{}, at most {:.0f}/s", q.total, q.peak_per_second));
  }
  row("outlived the window", fmt::format("{} (window {})", OutlivedWindow(r), Secs(r.window)));
  row("invariant violations",
      fmt::format("{}{}", r.violations.size(),
                  OverCommits(r) > 0 ? fmt::format(" ({} over-commit)", OverCommits(r)) : ""));
  return rows;
}

// Two runs' rows side by side, matched by name in the left run's order; a row only one run has
// (a figure shown only when it occurred) gets "-" in the other.
struct SideRow {
  std::string name, left, right;
};
std::vector<SideRow> SideBySide(const Rows& left, const Rows& right) {
  std::vector<SideRow> out;
  size_t next = 0;
  for (const auto& row : left) {
    const std::string& name = row.first;
    const std::string& value = row.second;
    auto it = std::find_if(right.begin() + static_cast<std::ptrdiff_t>(next), right.end(),
                           [&](const auto& other) { return other.first == name; });
    if (it == right.end()) {
      out.push_back({name, value, "-"});
      continue;
    }
    for (; right.begin() + static_cast<std::ptrdiff_t>(next) != it; ++next) {
      out.push_back({right[next].first, "-", right[next].second});
    }
    out.push_back({name, value, it->second});
    ++next;
  }
  for (; next < right.size(); ++next) {
    out.push_back({right[next].first, "-", right[next].second});
  }
  return out;
}

std::string ArgsText(const RunResult& r) {
  return r.scheduler_args.empty() ? "(serve's defaults)" : r.scheduler_args;
}

// "PASS", "FAIL"; for a comparison, whether it showed what it was run to show.
std::string VerdictText(const RunResult& r, bool comparison) {
  if (!comparison) {
    return r.violations.empty() ? "PASS" : "FAIL";
  }
  if (OverCommits(r) > 0) {
    return "FAIL: over-commit";
  }
  return OutlivedWindow(r) > 0 ? "FAIL, as expected: the divergence outlived the window"
                               : "PASS: the divergence did not show";
}

// The first `most` violations, a line each.
std::string ViolationLines(const RunResult& r, size_t most) {
  std::string out;
  for (size_t i = 0; i < r.violations.size() && i < most; ++i) {
    out += fmt::format("    at {}: {}\n", Secs(r.violations[i].at - r.start), r.violations[i].what);
  }
  if (r.violations.size() > most) {
    out += fmt::format("    ... and {} more (summary.json lists them all)\n",
                       r.violations.size() - most);
  }
  return out;
}

// What the two runs show together, in a line or two.
std::string Conclusion(const RunResult& p, const RunResult& c) {
  const int64_t kept = OutlivedWindow(c);
  std::string out;
  if (kept == 0) {
    out = fmt::format(
        "comparison: {} kept no divergence past the {} window: this run did not show the "
        "difference from {}.\n",
        c.label, Secs(c.window), p.label);
  } else {
    const absl::Time end = c.start + c.elapsed;
    const int64_t shares = static_cast<int64_t>(PodShareDivergences(c, true));
    out = fmt::format(
        "comparison: {} kept {} divergences ({} devices, {} pod shares) past the {} "
        "window (the longest {}); {} {}.\n",
        c.label, kept, kept - shares, shares, Secs(c.window), Secs(Longest(c, end)->Length(end)),
        p.label,
        OutlivedWindow(p) == 0 ? "healed every divergence within the window"
                               : fmt::format("kept {} past it as well", OutlivedWindow(p)));
  }
  if (OverCommits(c) > 0) {
    out += fmt::format("comparison: {} over-committed a device: a failure whatever the flags.\n",
                       c.label);
  }
  return out;
}

}  // namespace

std::string SummaryTable(const RunResult& r, const RunResult* c) {
  std::string out = fmt::format(
      "tessera simulate: scenario {} (seed {}), {} nodes, {} GPUs, {} + drain{}\n", r.scenario,
      r.seed, r.nodes, r.gpus, Secs(r.duration), c == nullptr ? "" : ", run twice");
  if (c == nullptr) {
    for (const auto& [k, v] : Figures(r, false)) {
      out += fmt::format("  {:<30} {}\n", k, v);
    }
    out += ViolationLines(r, 10);
    out += r.violations.empty() ? "verdict: PASS\n" : "verdict: FAIL\n";
    return out;
  }
  Rows left = Figures(r, true);
  Rows right = Figures(*c, true);
  left.insert(left.begin(), {{"run", r.label}, {"scheduler args", ArgsText(r)}});
  right.insert(right.begin(),
               {{"run", "comparison: " + c->label}, {"scheduler args", ArgsText(*c)}});
  left.emplace_back("verdict", VerdictText(r, false));
  right.emplace_back("verdict", VerdictText(*c, true));
  const std::vector<SideRow> rows = SideBySide(left, right);
  size_t width = 0;
  for (const SideRow& row : rows) {
    width = std::max(width, row.left.size());
  }
  for (const SideRow& row : rows) {
    out += fmt::format("  {:<30} {:<{}}  {}\n", row.name, row.left, width, row.right);
  }
  for (const RunResult* run : {&r, c}) {
    const absl::Time run_end = run->start + run->elapsed;
    if (const Divergence* d = Longest(*run, run_end); d != nullptr) {
      out += fmt::format("longest divergence, {}: {} on {} ({}), cause {}\n", run->label,
                         Secs(d->Length(run_end)), Subject(*d), d->node, d->cause);
    }
    if (!run->violations.empty()) {
      out += fmt::format("violations, {} ({}):\n", run->label, run->violations.size());
      out += ViolationLines(*run, run == c ? 5 : 10);
    }
  }
  out += Conclusion(r, *c);
  if (OverCommits(*c) > 0) {
    out += fmt::format("verdict: FAIL (comparison: {} over-committed a device)\n", c->label);
  } else {
    out += fmt::format("verdict: {} ({}'s; the comparison's divergences are expected)\n",
                       r.violations.empty() ? "PASS" : "FAIL", r.label);
  }
  return out;
}

namespace {

nlohmann::json RunJson(const RunResult& r) {
  using nlohmann::json;
  const absl::Time end = r.start + r.elapsed;
  const RequeueWrites requeue = ComputeRequeueWrites(r.samples);
  json j = {
      {"scenario", r.scenario},
      {"control_plane", r.control_plane},
      {"scheduler", r.scheduler},
      {"label", r.label},
      {"seed", r.seed},
      {"scheduler_args", r.scheduler_args},
      {"nodes", r.nodes},
      {"gpus", r.gpus},
      {"duration_s", absl::ToDoubleSeconds(r.duration)},
      {"convergence_window_s", absl::ToDoubleSeconds(r.window)},
      {"elapsed_s", absl::ToDoubleSeconds(r.elapsed)},
      {"pods",
       {{"created", r.created},
        {"scheduled", r.scheduled},
        {"unschedulable", r.unschedulable},
        {"unschedulable_attempts", r.unschedulable_attempts},
        {"quota_refusals", r.quota_refusals},
        {"mig_pods", r.mig_pods},
        {"mig_instances", r.mig_instances},
        {"mig_refusals", r.mig_refusals},
        {"deleted", r.deleted},
        {"evicted", r.evicted},
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
      {"requeue_writes", {{"total", requeue.total}, {"peak_per_second", requeue.peak_per_second}}},
      {"repair_waits",
       {{"refused_while_wrong", r.repair_waits.refused_while_wrong},
        {"bound_before_repair", r.repair_waits.bound_before_repair},
        {"still_pending", r.repair_waits.still_pending},
        {"bound_after_repair_s", r.repair_waits.seconds}}},
      {"outlived_window", OutlivedWindow(r)},
      {"overcommits", OverCommits(r)},
      {"passed", r.violations.empty()}};
  json faults = json::array();
  for (const FaultRecord& f : r.faults) {
    faults.push_back(
        {{"at_s", absl::ToDoubleSeconds(f.at)}, {"kind", f.kind}, {"detail", f.detail}});
  }
  j["faults"] = faults;
  if (r.preemption.has_value()) {
    const PreemptionFindings& p = *r.preemption;
    j["preemption"] = {{"preemptions", p.preemptions},
                       {"victims", p.victims},
                       {"unattributed", p.unattributed},
                       {"judged", p.judged},
                       {"not_judged",
                        {{"node_changed", p.unjudged_changed},
                         {"nomination_held", p.unjudged_nominated},
                         {"request_not_modelled", p.unjudged_request}}},
                       {"preemptors",
                        {{"bound_on_freed_node", p.bound_there},
                         {"bound_elsewhere", p.bound_elsewhere},
                         {"never_bound", p.never_bound}}}};
  }
  json skipped = json::array();
  for (const FaultRecord& f : r.skipped_faults) {
    skipped.push_back(
        {{"at_s", absl::ToDoubleSeconds(f.at)}, {"kind", f.kind}, {"reason", f.detail}});
  }
  j["skipped_faults"] = skipped;
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
  return j;
}

}  // namespace

std::string SummaryJson(const RunResult& r, const RunResult* c) {
  nlohmann::json j = RunJson(r);
  if (c != nullptr) {
    j["comparison"] = RunJson(*c);
    j["comparison"]["showed_divergence"] = OutlivedWindow(*c) > 0;
  }
  j["succeeded"] = Succeeded(r, c);
  return j.dump(2) + "\n";
}

namespace {

// The chart of one run: allocated memory, truth against exported, with faults, divergences and
// the drain; `tmax` seconds and `ymax` MiB are the axes' ends (shared by both runs' charts).
std::string Chart(const RunResult& r, double tmax, double ymax) {
  const absl::Time end = r.start + r.elapsed;
  const double width = 1000, height = 360, left = 70, right = 20, top = 20, bottom = 40;
  // A round GiB step for the y axis: 1, 2 or 5 × 10^k, about five lines.
  double step_gib = 1;
  while (ymax / 1024 / step_gib > 5) {
    const double m = step_gib / std::pow(10.0, std::floor(std::log10(step_gib)));
    step_gib *= m == 2 ? 2.5 : 2;
  }
  const int ylines = static_cast<int>(std::ceil(ymax / 1024 / step_gib));
  ymax = std::max(1.0, ylines * step_gib * 1024);
  auto x = [&](double t) { return left + (width - left - right) * std::min(t, tmax) / tmax; };
  auto y = [&](double v) { return top + (height - top - bottom) * (1 - v / ymax); };
  std::string svg = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {} {}' width='100%'>\n", width, height);
  // axes and grid
  for (int i = 0; i <= ylines; ++i) {
    const double v = i * step_gib * 1024;
    svg += fmt::format(
        "<line x1='{}' x2='{}' y1='{:.1f}' y2='{:.1f}' stroke='#e5e5e5'/>"
        "<text x='{}' y='{:.1f}' font-size='11' text-anchor='end' fill='#555'>{:.0f} GiB</text>\n",
        left, width - right, y(v), y(v), left - 6, y(v) + 4, v / 1024);
  }
  const int step = tmax > 120 ? 30 : (tmax > 40 ? 10 : 5);
  for (int t = 0; t <= static_cast<int>(tmax); t += step) {
    svg += fmt::format(
        "<text x='{:.1f}' y='{}' font-size='11' text-anchor='middle' fill='#555'>{}s</text>\n",
        x(t), height - bottom + 16, t);
  }
  svg += fmt::format("<line x1='{}' x2='{}' y1='{}' y2='{}' stroke='#333'/>", left, width - right,
                     height - bottom, height - bottom);
  svg += fmt::format("<line x1='{}' x2='{}' y1='{}' y2='{}' stroke='#333'/>\n", left, left, top,
                     height - bottom);
  // drain region
  const double drain_x = x(absl::ToDoubleSeconds(r.duration));
  svg += fmt::format(
      "<rect x='{:.1f}' y='{}' width='{:.1f}' height='{}' fill='#f4f4f4'/>"
      "<text x='{:.1f}' y='{}' font-size='11' fill='#777'>drain</text>\n",
      drain_x, top, std::max(0.0, width - right - drain_x), height - top - bottom, drain_x + 4,
      top + 12);
  // divergence spans
  for (const Divergence& d : r.divergences) {
    const double a = absl::ToDoubleSeconds(d.start - r.start);
    const double b =
        absl::ToDoubleSeconds((d.end == absl::InfiniteFuture() ? end : d.end) - r.start);
    svg += fmt::format(
        "<rect x='{:.1f}' y='{}' width='{:.1f}' height='6' fill='{}' opacity='0.6'>"
        "<title>{} {}: {}</title></rect>\n",
        x(a), height - bottom - 6, std::max(1.5, x(b) - x(a)), d.violation ? "#d62728" : "#ff9f1c",
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
        fx, top, height - bottom, Escape(f.kind), Escape(f.detail), fx + 3, top + 2);
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
  return svg;
}

// The chart of a run under its title and verdict (`css`: pass, fail or expected).
std::string ChartSection(const RunResult& r, const std::string& title, const std::string& verdict,
                         const char* css, double tmax, double ymax) {
  std::string html = fmt::format(
      "<section><h2>{} <span class='{}'>{}</span></h2>\n<p>scheduler args: <code>{}</code></p>\n",
      Escape(title), css, Escape(verdict), Escape(ArgsText(r)));
  html +=
      "<div class='legend'>"
      "<span><i class='sw' style='background:#1f77b4'></i>truth (from the API server's pods)</span>"
      "<span><i class='sw' style='background:#ff7f0e'></i>exported by Tessera "
      "(hami_gpu_memory_allocated_bytes)</span>"
      "<span><i class='sw' style='background:#9467bd'></i>fault</span>"
      "<span><i class='sw' style='background:#ff9f1c'></i>divergence (healed)</span>"
      "<span><i class='sw' style='background:#d62728'></i>divergence (violation)</span></div>\n";
  html += Chart(r, tmax, ymax);
  html += "</section>\n";
  return html;
}

// A run's violations, faults and divergences; long lists folded (<details>, no script).
std::string Details(const RunResult& r, const std::string& title) {
  const absl::Time end = r.start + r.elapsed;
  auto fold = [](size_t rows) { return rows > 20 ? "<details>" : "<details open>"; };
  std::string html = fmt::format("<section><h2>{}</h2>\n", Escape(title));
  if (!r.violations.empty()) {
    html += fmt::format("{}<summary>Violations: {}</summary>\n<pre>", fold(r.violations.size()),
                        r.violations.size());
    for (const Violation& v : r.violations) {
      html += Escape(fmt::format("at {}: {}", Secs(v.at - r.start), v.what)) + "\n";
    }
    html += "</pre></details>\n";
  }
  html += fmt::format(
      "{}<summary>Faults: {}</summary>\n<table><tr><th>at</th><th>fault</th><th>detail</th></tr>\n",
      fold(r.faults.size()), r.faults.size());
  for (const FaultRecord& f : r.faults) {
    html += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>\n", Secs(f.at), Escape(f.kind),
                        Escape(f.detail));
  }
  html += fmt::format(
      "</table></details>\n{}<summary>Divergences (2+ samples): {}</summary>\n<table><tr>"
      "<th>start</th><th>end</th><th>length</th><th>device</th><th>pod</th><th>node</th>"
      "<th>cause</th><th>at its start</th></tr>\n",
      fold(r.divergences.size()), r.divergences.size());
  for (const Divergence& d : r.divergences) {
    html += fmt::format(
        "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td></tr>\n",
        d.violation ? " class='fail'" : "", Secs(d.start - r.start),
        d.end == absl::InfiniteFuture() ? "open" : Secs(d.end - r.start), Secs(d.Length(end)),
        Escape(d.device), d.pod.empty() ? "(device)" : Escape(d.pod), Escape(d.node),
        Escape(d.cause), Escape(d.detail));
  }
  html += "</table></details></section>\n";
  return html;
}

}  // namespace

std::string ReportHtml(const RunResult& r, const RunResult* c) {
  // Both charts on the same axes, so that they compare at a glance.
  double tmax = 1;
  double ymax = 1;
  for (const RunResult* run : {&r, c}) {
    if (run == nullptr) {
      continue;
    }
    for (const Sample& s : run->samples) {
      tmax = std::max(tmax, absl::ToDoubleSeconds(s.at));
      ymax =
          std::max({ymax, static_cast<double>(s.truth_mib), static_cast<double>(s.exported_mib)});
    }
  }
  const bool ok = Succeeded(r, c);
  std::string html =
      "<!doctype html>\n<html><head><meta charset='utf-8'><title>tessera simulate: " +
      Escape(r.scenario) +
      "</title>\n<style>"
      "body{font-family:sans-serif;margin:24px;color:#222;max-width:1100px}"
      "table{border-collapse:collapse;margin:8px 0 20px}"
      "td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;font-size:13px}"
      "th{background:#f6f6f6}.pass{color:#2ca02c}.fail{color:#d62728}.expected{color:#b35900}"
      ".legend span{display:inline-block;margin-right:18px;font-size:13px}"
      ".sw{display:inline-block;width:24px;height:3px;vertical-align:middle;margin-right:6px}"
      "pre{background:#f6f6f6;padding:10px;font-size:12px;white-space:pre-wrap}"
      "section{border-top:2px solid #ddd;margin-top:24px}"
      "p.conclusion{font-size:15px;background:#f6f6f6;padding:10px}"
      "summary{font-weight:bold;margin:12px 0 6px;cursor:pointer}"
      "</style></head><body>\n";
  html += fmt::format("<h1>tessera simulate — {} <span class='{}'>{}</span></h1>\n",
                      Escape(r.scenario), ok ? "pass" : "fail", ok ? "PASS" : "FAIL");
  html += fmt::format(
      "<p>scheduler under test <b>{}</b>, control plane <b>{}</b>, seed {}, {} nodes, {} GPUs, "
      "workload {} then "
      "drain, convergence window {}",
      Escape(r.scheduler),
      r.control_plane == "real" ? "real (etcd, kube-apiserver, kube-scheduler)"
                                : "apisim (kube-scheduler emulated)",
      r.seed, r.nodes, r.gpus, Secs(r.duration), Secs(r.window));
  if (c != nullptr) {
    html += fmt::format(
        "; run twice with the same seed: <b>{}</b> (<code>{}</code>), the verdict, and "
        "<b>comparison: {}</b> (<code>{}</code>), reported, not judged",
        Escape(r.label), Escape(ArgsText(r)), Escape(c->label), Escape(ArgsText(*c)));
  } else {
    html += fmt::format("; scheduler args: <code>{}</code>", Escape(ArgsText(r)));
  }
  html += "</p>\n";
  if (c != nullptr) {
    html += "<p class='conclusion'>" + Escape(Conclusion(r, *c)) + "</p>\n";
  }
  // The figures, side by side with a comparison.
  html += "<h2>Summary</h2>\n<table>";
  Rows left = Figures(r, false);
  Rows right = c != nullptr ? Figures(*c, false) : Rows{};
  if (c != nullptr) {
    html += fmt::format(
        "<tr><th></th><th>{}</th><th>comparison: {}</th></tr>\n"
        "<tr><th>scheduler args</th><td><code>{}</code></td><td><code>{}</code></td></tr>\n",
        Escape(r.label), Escape(c->label), Escape(ArgsText(r)), Escape(ArgsText(*c)));
  }
  left.emplace_back("verdict", VerdictText(r, false));
  if (c != nullptr) {
    right.emplace_back("verdict", VerdictText(*c, true));
  }
  if (c == nullptr) {
    for (const auto& [name, value] : left) {
      html += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", Escape(name), Escape(value));
    }
  } else {
    for (const SideRow& row : SideBySide(left, right)) {
      html += fmt::format("<tr><th>{}</th><td>{}</td><td>{}</td></tr>\n", Escape(row.name),
                          Escape(row.left), Escape(row.right));
    }
  }
  html += "</table>\n";
  // The charts one above the other, then the details.
  html += ChartSection(
      r, c != nullptr ? r.label + ": allocated GPU memory" : "Allocated GPU memory, whole cluster",
      VerdictText(r, false), r.violations.empty() ? "pass" : "fail", tmax, ymax);
  if (c != nullptr) {
    html +=
        ChartSection(*c, "comparison: " + c->label + ": allocated GPU memory",
                     VerdictText(*c, true), OverCommits(*c) > 0 ? "fail" : "expected", tmax, ymax);
  }
  html += Details(r, c != nullptr ? r.label + ": details" : "Details");
  if (c != nullptr) {
    html += Details(*c, "comparison: " + c->label + ": details");
  }
  html += "</body></html>\n";
  return html;
}

}  // namespace tessera::sim
