// File: tessera/explain/top.h
//
// `tessera top`: every node's devices and the pods holding them, as serve's ledger has them.
// The input is the metrics listener's /debug/ledger document (serve/debug_json.h renders it from
// one ledger snapshot, the one /metrics reads); this file decodes the parts `top` shows,
// filters and sorts them, and renders a table or JSON.
//
//   absl::StatusOr<TopView> view = DecodeTop(body);
//   TopView shown = FilterTop(*std::move(view), {.ns = "ml", .sort = TopSort::kFree});
//   std::string table = RenderTopText(shown, clock->Now());
//
// Errors: DecodeTop returns InvalidArgument naming the field that is missing or of the wrong
// type ("nodes[2].devices[0].devmem_mib: expected an integer"); the document comes over the
// network and is checked whole before anything is shown.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include <nlohmann/json.hpp>

namespace tessera::explain {

struct TopPod {
  std::string ns, name, uid;
  int64_t container = 0;
  bool init = false;
  int64_t usedmem = 0;                   // MiB on this device
  int64_t usedcores = 0;                 // percent of this device
  bool reserved = false;                 // filtered, not yet bound
  std::optional<absl::Time> expires_at;  // a reservation's expiry
};

struct TopDevice {
  std::string uuid, type;
  int64_t index = 0;
  bool health = true, cordoned = false;
  int64_t count = 0, devmem = 0, devcore = 0;  // capacity: shares, MiB, percent
  int64_t used = 0, usedmem = 0, usedcores = 0;
  std::vector<TopPod> pods;

  int64_t FreeMem() const { return devmem > usedmem ? devmem - usedmem : 0; }
};

struct TopNode {
  std::string name;
  std::string availability;  // the registry's view ("available", ...); empty when unknown
  std::string detail;
  std::vector<TopDevice> devices;

  int64_t FreeMem() const;  // over its healthy, uncordoned devices
};

struct TopView {
  bool synced = false;
  std::string role;  // "leader" or "follower"
  std::vector<TopNode> nodes;
  std::vector<std::string> problems;  // one line each: orphans, conflicts, unregistered, unreadable
};

absl::StatusOr<TopView> DecodeTop(std::string_view ledger_json);

enum class TopSort { kNode, kFree };

struct TopOptions {
  std::string node;      // only this node; empty: every node
  std::string ns;        // only devices holding pods of this namespace, and only those pods
  int64_t min_free = 0;  // only devices with at least this many MiB free
  TopSort sort = TopSort::kNode;  // kFree: most free memory first (nodes, then their devices)
};

// The view with what the options exclude removed (nodes left without devices are dropped when a
// device filter is set) and sorted; problems are kept whole, or, with `ns`, those naming it.
TopView FilterTop(TopView view, const TopOptions& options);

// The table: a line per device with its usage, then a line per pod holding it (reservations
// with the time left); nodes in the view's order; problems at the end.
std::string RenderTopText(const TopView& view, absl::Time now);
nlohmann::json TopJson(const TopView& view);

}  // namespace tessera::explain
