// logitctl weights register, load, list and release.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/logitctl/commands.h"
#include "client/logitctl/common.h"
#include "client/logitctl/flags.h"
#include "logitd/client.h"
#include "logitd/tensor.h"

namespace logitd::logitctl {
namespace {

// A registered weight, one row a field; `show_converted` adds whether the
// server rounded the file's tensor to bf16 (weights load).
void PrintWeightInfo(const client::WeightInfo& info, bool show_converted) {
  std::vector<std::pair<std::string, std::string>> rows = {{"handle", info.handle},
                                                           {"name", info.name},
                                                           {"shape", ShapeString(info.shape)},
                                                           {"xxh3", Hex64(info.xxh3)},
                                                           {"bytes", Bytes(info.bytes)}};
  if (show_converted) {
    rows.emplace_back("converted",
                      info.converted_from.empty()
                          ? "no (bf16 in the file)"
                          : absl::StrCat(info.converted_from, " -> bf16 (round to nearest even)"));
  }
  rows.emplace_back("already_registered", info.already_registered ? "true" : "false");
  rows.emplace_back("registrations", absl::StrCat(info.registrations));
  PrintRows(rows);
}

}  // namespace

int CmdWeightsRegister(const std::vector<std::string>& words) {
  if (words.size() != 3)
    return UsageError("usage: weights register FILE --tensor=NAME [--name=NAME]");
  absl::StatusOr<NamedTensor> loaded =
      LoadTensor(words[2], absl::GetFlag(FLAGS_tensor), "weight file");
  if (!loaded.ok()) return InputError(loaded.status());
  const std::string tensor_name = loaded->name;
  absl::StatusOr<Tensor> w = ToBf16(*std::move(loaded), "weight");
  if (!w.ok()) return InputError(w.status());
  std::string name = absl::GetFlag(FLAGS_name);
  if (name.empty()) name = tensor_name;
  return WithClient([&](client::Client& c) {
    absl::StatusOr<client::WeightInfo> info = c.RegisterWeight(*w, name);
    if (!info.ok()) return ServerError(info.status());
    PrintWeightInfo(*info, /*show_converted=*/false);
    return kExitOk;
  });
}

int CmdWeightsLoad(const std::vector<std::string>& words) {
  const std::string tensor = absl::GetFlag(FLAGS_tensor);
  if (words.size() != 3 || tensor.empty()) {
    return UsageError("usage: weights load PATH --tensor=NAME [--name=NAME]");
  }
  return WithClient([&](client::Client& c) {
    absl::StatusOr<client::WeightInfo> info =
        c.LoadWeight(words[2], tensor, absl::GetFlag(FLAGS_name));
    if (!info.ok()) return ServerError(info.status());
    PrintWeightInfo(*info, /*show_converted=*/true);
    return kExitOk;
  });
}

int CmdWeightsList(const std::vector<std::string>& words) {
  if (words.size() != 2) return UsageError("weights list takes no arguments");
  return WithClient([](client::Client& c) {
    absl::StatusOr<std::vector<client::WeightInfo>> list = c.ListWeights();
    if (!list.ok()) return ServerError(list.status());
    std::vector<std::vector<std::string>> rows = {
        {"HANDLE", "NAME", "SHAPE", "BYTES", "GRADIENT", "REGISTRATIONS", "XXH3"}};
    for (const client::WeightInfo& w : *list) {
      rows.push_back({w.handle, w.name.empty() ? "-" : w.name, ShapeString(w.shape),
                      absl::StrCat(w.bytes), w.has_gradient ? "yes" : "no",
                      absl::StrCat(w.registrations), Hex64(w.xxh3)});
    }
    PrintTable(rows);
    return kExitOk;
  });
}

int CmdWeightsRelease(const std::vector<std::string>& words) {
  if (words.size() != 3) return UsageError("usage: weights release HANDLE [--force]");
  return WithClient([&](client::Client& c) {
    absl::StatusOr<std::uint64_t> freed = c.ReleaseWeight(words[2], absl::GetFlag(FLAGS_force));
    if (!freed.ok()) return ServerError(freed.status());
    PrintRows({{"released", words[2]}, {"bytes_freed", Bytes(*freed)}});
    return kExitOk;
  });
}

}  // namespace logitd::logitctl
