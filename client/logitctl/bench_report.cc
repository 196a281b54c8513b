#include "client/logitctl/bench_report.h"

#include <cstdint>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/logitctl/common.h"

namespace logitd::logitctl {
namespace {

std::string Cell(const nlohmann::json& v, const absl::FormatSpec<double>& format) {
  if (v.is_null()) return "absent";
  return absl::StrFormat(format, v.get<double>());
}

// The run's configuration and the server, two lines.
void PrintBenchHeader(const nlohmann::json& report) {
  const nlohmann::json& cfg = report["config"];
  const nlohmann::json& info = report["server_info"];
  std::cout << absl::StrFormat(
      "logitctl bench: %s M=%d K=%d V=%d out=%s%s; concurrency %d, channels %d, %s, warmup %d\n",
      cfg["rpc"].get<std::string>(), cfg["m"].get<std::int64_t>(), cfg["k"].get<std::int64_t>(),
      cfg["v"].get<std::int64_t>(), cfg["out_dtype"].get<std::string>(),
      absl::StrCat((cfg["rpc"].get<std::string>() == "logits" ||
                    cfg["rpc"].get<std::string>() == "logprobs") &&
                           !cfg.value("pipeline", true)
                       ? " unpipelined"
                       : "",
                   cfg.value("connections", 1) > 1
                       ? absl::StrCat(", ", cfg.value("connections", 1), " connections a call")
                       : ""),
      cfg["concurrency"].get<int>(), cfg["channels"].get<int>(),
      cfg["requests"].get<std::int64_t>() > 0
          ? absl::StrCat(cfg["requests"].get<std::int64_t>(), " requests")
          : absl::StrFormat("%.1f s", cfg["duration_s"].get<double>()),
      cfg["warmup"].get<std::int64_t>());
  std::cout << absl::StrFormat(
      "server: %s on %s (%s), response chunks %d B; client request chunks %d B\n",
      info["backend"].get<std::string>(), info["device_name"].get<std::string>(),
      info["build_id"].get<std::string>(), info["chunk_bytes"].get<std::uint64_t>(),
      cfg["client_chunk_bytes"].get<std::uint64_t>());
}

// One column per phase (the RPC, then its baseline or the operation a verify
// is measured against), one row per figure.
std::vector<std::vector<std::string>> BenchTable(const nlohmann::json& report) {
  std::vector<const nlohmann::json*> phases;
  for (const nlohmann::json& p : report["phases"]) phases.push_back(&p);

  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {""};
  for (const nlohmann::json* p : phases) {
    head.push_back(p->at("rpc").get<std::string>() == "baseline" ? "baseline (Probe)"
                                                                 : p->at("rpc").get<std::string>());
  }
  rows.push_back(head);
  auto row = [&](const std::string& label,
                 const std::function<std::string(const nlohmann::json&)>& f) {
    std::vector<std::string> r = {label};
    for (const nlohmann::json* p : phases) r.push_back(f(*p));
    rows.push_back(std::move(r));
  };
  row("requests ok",
      [](const nlohmann::json& p) { return absl::StrCat(p["completed"].get<std::int64_t>()); });
  row("errors", [](const nlohmann::json& p) {
    std::string s = absl::StrCat(p["error_count"].get<std::int64_t>());
    for (const auto& [code, e] : p["errors"].items()) {
      absl::StrAppend(&s, " ", code, "=", e["count"].get<std::int64_t>());
    }
    return s;
  });
  row("requests/s", [](const nlohmann::json& p) { return Cell(p["requests_per_s"], "%.2f"); });
  for (const char* q : {"p50", "p90", "p99", "max"}) {
    row(absl::StrCat("latency ", q, " ms"),
        [q](const nlohmann::json& p) { return Cell(p["latency_ms"][q], "%.2f"); });
  }
  row("up GB/s", [](const nlohmann::json& p) { return Cell(p["up_gb_s"], "%.3f"); });
  row("down GB/s", [](const nlohmann::json& p) { return Cell(p["down_gb_s"], "%.3f"); });
  for (absl::string_view part : kBenchTimingParts) {
    const std::string key = absl::StrCat(part, "_us");
    row(absl::StrCat("server ", key, " (avg)"),
        [key](const nlohmann::json& p) { return Cell(p["server_avg"][key], "%.0f"); });
  }
  row("server unaccounted_us (avg)",
      [](const nlohmann::json& p) { return Cell(p["server_avg"]["unaccounted_us"], "%.0f"); });
  // The slowest 1%: their latency and where the server spent it.
  row("slowest 1% latency ms", [](const nlohmann::json& p) {
    return p.contains("server_slowest") && !p["server_slowest"].is_null()
               ? Cell(p["server_slowest"]["latency_ms"], "%.2f")
               : std::string("-");
  });
  for (absl::string_view part : {"queue", "receive", "compute", "send"}) {
    const std::string key = absl::StrCat(part, "_us");
    row(absl::StrCat("slowest 1% server ", key), [key](const nlohmann::json& p) {
      return p.contains("server_slowest") && !p["server_slowest"].is_null()
                 ? Cell(p["server_slowest"][key], "%.0f")
                 : std::string("-");
    });
  }
  return rows;
}

// Each phase's first message of each failed status, the payload, and the
// ratios of the phases.
void PrintBenchFooter(const nlohmann::json& report) {
  const nlohmann::json& cfg = report["config"];
  for (const nlohmann::json& p : report["phases"]) {
    for (const auto& [code, e] : p.at("errors").items()) {
      std::cout << absl::StrFormat("%s: first %s: %s\n", p.at("rpc").get<std::string>(), code,
                                   e["first_message"].get<std::string>());
    }
  }
  std::cout << absl::StrFormat(
      "payload per request: %d B up, %d B down (tensor bytes; GB = 1e9 B)\n",
      cfg["request_bytes"].get<std::uint64_t>(), cfg["response_bytes"].get<std::uint64_t>());
  if (report.contains("verify_cost") && !report["verify_cost"].is_null()) {
    std::cout << absl::StrFormat(
        "verify cost: %.3f (%s p50 latency / %s p50 latency, sample_rows %d, same run)\n",
        report["verify_cost"].get<double>(), cfg["rpc"].get<std::string>(),
        report["phases"][1]["rpc"].get<std::string>(), cfg["sample_rows"].get<std::int64_t>());
  }
  if (report.contains("efficiency") && !report["efficiency"].is_null()) {
    std::cout << absl::StrFormat(
        "efficiency: %.3f (%s payload GB/s / raw gRPC Probe GB/s, same bytes, same run)\n",
        report["efficiency"].get<double>(), cfg["rpc"].get<std::string>());
  }
}

}  // namespace

void PrintBenchText(const nlohmann::json& report) {
  PrintBenchHeader(report);
  PrintTable(BenchTable(report));
  PrintBenchFooter(report);
}

}  // namespace logitd::logitctl
