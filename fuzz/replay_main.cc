// Runs the request fuzzer's entry point over files, without libFuzzer, so that
// a build with any compiler replays the checked-in corpus as a test:
//
//   request_fuzzer_replay FILE_OR_DIR...       replay every file (exit 0 when
//                                              none trips an invariant)
//   request_fuzzer_replay --write_seeds DIR    write the seed corpus to DIR
//   request_fuzzer_replay --verbose FILE...    also print each file's outcome
//
// The seeds are the calls a correct client makes plus one of each kind of
// bad request the service must refuse; the fuzzer mutates from there.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "fuzz/request_input.h"
#include "logitd/tensor.h"
#include "logitd/v1/logitd.pb.h"
#include "logitd/wire/wire.h"
#include "tests/common/targets.h"

namespace logitd::fuzz {
namespace {

using ::logitd::testing::TargetsTensor;

// Prefix bytes of the seeds: weight [8, 4], limit 2^16 bytes.
constexpr std::uint8_t kV = 7;
constexpr std::uint8_t kK = 3;
constexpr std::uint8_t kLimit = 16;

v1::TensorSpec SpecOf(const std::string& name, const Tensor& t) { return wire::MakeSpec(name, t); }

// A tensor with deterministic, not all-zero contents.
Tensor Filled(DType dtype, std::vector<std::int64_t> shape, std::uint8_t salt) {
  Tensor t(dtype, std::move(shape));
  for (std::size_t i = 0; i < t.nbytes(); ++i) {
    t.bytes()[i] = static_cast<std::byte>((i * 37 + salt) & 0x3f);
  }
  return t;
}

// Chunk messages of `t` as request type R, `chunk` bytes each.
template <typename R>
std::vector<std::string> Chunks(const std::string& name, const Tensor& t, std::size_t chunk) {
  std::vector<std::string> out;
  (void)wire::SendChunks(name, t.bytes(), t.nbytes(), chunk, [&](v1::TensorChunk&& c) {
    R r;
    *r.mutable_chunk() = std::move(c);
    out.push_back(r.SerializeAsString());
    return true;
  });
  return out;
}

template <typename R, typename H>
std::string HeaderMessage(const H& header) {
  R r;
  *r.mutable_header() = header;
  return r.SerializeAsString();
}

void Append(std::vector<std::string>* to, const std::vector<std::string>& more) {
  to->insert(to->end(), more.begin(), more.end());
}

using Seeds = std::vector<std::pair<std::string, std::string>>;

void LogitsSeeds(Seeds* seeds) {
  const Tensor x = Filled(DType::kBf16, {2, 4}, 1);
  v1::LogitsHeader h;
  h.set_weight_handle("w");
  *h.mutable_x() = SpecOf("x", x);
  const std::string head = HeaderMessage<v1::LogitsRequest>(h);
  std::vector<std::string> ok = {head};
  Append(&ok, Chunks<v1::LogitsRequest>("x", x, 6));
  seeds->emplace_back("logits_ok", EncodeRequestInput(Call::kLogits, kV, kK, kLimit, ok));
  seeds->emplace_back("logits_truncated",
                      EncodeRequestInput(Call::kLogits, kV, kK, kLimit, {ok[0], ok[1]}));
  std::vector<std::string> swapped = {ok[0], ok[2], ok[1], ok[3]};
  seeds->emplace_back("logits_out_of_order",
                      EncodeRequestInput(Call::kLogits, kV, kK, kLimit, swapped));
  v1::LogitsHeader bad_digest = h;
  bad_digest.mutable_x()->set_xxh3(h.x().xxh3() ^ 1);
  std::vector<std::string> corrupt = ok;
  corrupt[0] = HeaderMessage<v1::LogitsRequest>(bad_digest);
  seeds->emplace_back("logits_bad_digest",
                      EncodeRequestInput(Call::kLogits, kV, kK, kLimit, corrupt));
  std::vector<std::string> two_headers = {head, head};
  seeds->emplace_back("logits_two_headers",
                      EncodeRequestInput(Call::kLogits, kV, kK, kLimit, two_headers));
  seeds->emplace_back("logits_chunk_first",
                      EncodeRequestInput(Call::kLogits, kV, kK, kLimit, {ok[1], ok[0]}));
  v1::LogitsHeader fp32_out = h;
  fp32_out.set_out_dtype(v1::DTYPE_BF16);
  fp32_out.set_alpha(0.5f);
  std::vector<std::string> bf16 = ok;
  bf16[0] = HeaderMessage<v1::LogitsRequest>(fp32_out);
  seeds->emplace_back("logits_bf16_out", EncodeRequestInput(Call::kLogits, kV, kK, kLimit, bf16));
  // The same call against a limit of 16 bytes: x (16) and y (64) do not fit.
  seeds->emplace_back("logits_over_limit", EncodeRequestInput(Call::kLogits, kV, kK, 4, ok));
  v1::LogitsHeader wrong_k = h;
  wrong_k.mutable_x()->set_shape(1, 5);
  seeds->emplace_back("logits_wrong_k",
                      EncodeRequestInput(Call::kLogits, kV, kK, kLimit,
                                         {HeaderMessage<v1::LogitsRequest>(wrong_k)}));
  v1::LogitsHeader overflow = h;
  overflow.mutable_x()->set_shape(0, std::int64_t{1} << 62);
  seeds->emplace_back("logits_overflow",
                      EncodeRequestInput(Call::kLogits, kV, kK, kLimit,
                                         {HeaderMessage<v1::LogitsRequest>(overflow)}));
  v1::LogitsHeader no_handle = h;
  no_handle.clear_weight_handle();
  seeds->emplace_back("logits_no_handle",
                      EncodeRequestInput(Call::kLogits, kV, kK, kLimit,
                                         {HeaderMessage<v1::LogitsRequest>(no_handle)}));
}

void BackwardSeeds(Seeds* seeds) {
  const Tensor dy = Filled(DType::kFp32, {2, 8}, 2);
  const Tensor x = Filled(DType::kBf16, {2, 4}, 3);
  v1::BackwardHeader h;
  h.set_weight_handle("w");
  *h.mutable_dy() = SpecOf("dy", dy);
  *h.mutable_x() = SpecOf("x", x);
  h.set_want_dx(true);
  h.set_want_dw(true);
  std::vector<std::string> ok = {HeaderMessage<v1::BackwardRequest>(h)};
  Append(&ok, Chunks<v1::BackwardRequest>("dy", dy, 24));
  Append(&ok, Chunks<v1::BackwardRequest>("x", x, 16));
  seeds->emplace_back("backward_ok", EncodeRequestInput(Call::kBackward, kV, kK, kLimit, ok));
  v1::BackwardHeader acc = h;
  acc.set_want_dx(false);
  acc.set_accumulate_dw(true);
  acc.mutable_dy()->set_dtype(v1::DTYPE_BF16);
  const Tensor dy16 = Filled(DType::kBf16, {2, 8}, 4);
  *acc.mutable_dy() = SpecOf("dy", dy16);
  std::vector<std::string> acc_msgs = {HeaderMessage<v1::BackwardRequest>(acc)};
  Append(&acc_msgs, Chunks<v1::BackwardRequest>("x", x, 16));
  Append(&acc_msgs, Chunks<v1::BackwardRequest>("dy", dy16, 32));
  seeds->emplace_back("backward_accumulate_bf16_dy",
                      EncodeRequestInput(Call::kBackward, kV, kK, kLimit, acc_msgs));
  v1::BackwardHeader same_name = h;
  same_name.mutable_x()->set_name("dy");
  seeds->emplace_back("backward_duplicate_name",
                      EncodeRequestInput(Call::kBackward, kV, kK, kLimit,
                                         {HeaderMessage<v1::BackwardRequest>(same_name)}));
  v1::BackwardHeader nothing = h;
  nothing.set_want_dx(false);
  nothing.set_want_dw(false);
  seeds->emplace_back("backward_nothing_wanted",
                      EncodeRequestInput(Call::kBackward, kV, kK, kLimit,
                                         {HeaderMessage<v1::BackwardRequest>(nothing)}));
  // A chunk past the tensor's end.
  std::vector<std::string> past = ok;
  v1::BackwardRequest extra;
  extra.mutable_chunk()->set_name("x");
  extra.mutable_chunk()->set_offset(16);
  extra.mutable_chunk()->set_data("zz");
  past.push_back(extra.SerializeAsString());
  seeds->emplace_back("backward_past_end",
                      EncodeRequestInput(Call::kBackward, kV, kK, kLimit, past));
}

void CastSeeds(Seeds* seeds) {
  const Tensor in = Filled(DType::kFp32, {3, 5}, 5);
  v1::CastHeader h;
  *h.mutable_input() = SpecOf("input", in);
  std::vector<std::string> ok = {HeaderMessage<v1::CastRequest>(h)};
  Append(&ok, Chunks<v1::CastRequest>("input", in, 20));
  seeds->emplace_back("cast_ok", EncodeRequestInput(Call::kCast, kV, kK, kLimit, ok));
  v1::CastHeader bf16_in = h;
  bf16_in.mutable_input()->set_dtype(v1::DTYPE_BF16);
  seeds->emplace_back(
      "cast_bf16_input",
      EncodeRequestInput(Call::kCast, kV, kK, kLimit, {HeaderMessage<v1::CastRequest>(bf16_in)}));
  std::vector<std::string> unknown = ok;
  v1::CastRequest stray;
  stray.mutable_chunk()->set_name("other");
  stray.mutable_chunk()->set_data("abcd");
  unknown.insert(unknown.begin() + 1, stray.SerializeAsString());
  seeds->emplace_back("cast_unknown_tensor",
                      EncodeRequestInput(Call::kCast, kV, kK, kLimit, unknown));
  std::vector<std::string> empty_msg = {ok[0], std::string()};
  seeds->emplace_back("cast_empty_message",
                      EncodeRequestInput(Call::kCast, kV, kK, kLimit, empty_msg));
}

void CrossEntropySeeds(Seeds* seeds) {
  const Tensor x = Filled(DType::kBf16, {3, 4}, 6);
  for (DType dtype : {DType::kInt64, DType::kInt32}) {
    const Tensor targets = TargetsTensor(dtype, {0, 7, -100});
    v1::CrossEntropyHeader h;
    h.set_weight_handle("w");
    *h.mutable_x() = SpecOf("x", x);
    *h.mutable_targets() = SpecOf("targets", targets);
    h.set_reduction(dtype == DType::kInt64 ? v1::REDUCTION_MEAN : v1::REDUCTION_NONE);
    h.set_want_lse(true);
    h.set_want_dx(true);
    h.set_want_dw(dtype == DType::kInt32);
    std::vector<std::string> ok = {HeaderMessage<v1::CrossEntropyRequest>(h)};
    Append(&ok, Chunks<v1::CrossEntropyRequest>("x", x, 8));
    Append(&ok, Chunks<v1::CrossEntropyRequest>("targets", targets, 8));
    const std::string tag = dtype == DType::kInt64 ? "int64" : "int32";
    seeds->emplace_back("cross_entropy_ok_" + tag,
                        EncodeRequestInput(Call::kCrossEntropy, kV, kK, kLimit, ok));
    // A target past V (with its digest right, so only the range check fails).
    const Tensor bad = TargetsTensor(dtype, {0, 8, 1});
    v1::CrossEntropyHeader hb = h;
    *hb.mutable_targets() = SpecOf("targets", bad);
    std::vector<std::string> bad_msgs = {HeaderMessage<v1::CrossEntropyRequest>(hb)};
    Append(&bad_msgs, Chunks<v1::CrossEntropyRequest>("x", x, 8));
    Append(&bad_msgs, Chunks<v1::CrossEntropyRequest>("targets", bad, 8));
    seeds->emplace_back("cross_entropy_target_out_of_range_" + tag,
                        EncodeRequestInput(Call::kCrossEntropy, kV, kK, kLimit, bad_msgs));
  }
  v1::CrossEntropyHeader h;
  h.set_weight_handle("w");
  *h.mutable_x() = SpecOf("x", x);
  *h.mutable_targets() = SpecOf("targets", TargetsTensor(DType::kInt64, {1, 2, 3}));
  h.set_ignore_index(2);
  h.set_reduction(v1::REDUCTION_SUM);
  h.set_z_loss(1e-4f);
  h.set_want_dw(true);
  h.set_accumulate_dw(true);
  seeds->emplace_back("cross_entropy_header_only",
                      EncodeRequestInput(Call::kCrossEntropy, kV, kK, kLimit,
                                         {HeaderMessage<v1::CrossEntropyRequest>(h)}));
  v1::CrossEntropyHeader fp32_targets = h;
  fp32_targets.mutable_targets()->set_dtype(v1::DTYPE_FP32);
  seeds->emplace_back("cross_entropy_fp32_targets",
                      EncodeRequestInput(Call::kCrossEntropy, kV, kK, kLimit,
                                         {HeaderMessage<v1::CrossEntropyRequest>(fp32_targets)}));
}

void RegisterSeeds(Seeds* seeds) {
  const Tensor w = Filled(DType::kBf16, {8, 4}, 7);
  v1::RegisterWeightHeader h;
  h.set_name("lm_head");
  *h.mutable_weight() = SpecOf("weight", w);
  std::vector<std::string> ok = {HeaderMessage<v1::RegisterWeightRequest>(h)};
  Append(&ok, Chunks<v1::RegisterWeightRequest>("weight", w, 24));
  seeds->emplace_back("register_ok", EncodeRequestInput(Call::kRegisterWeight, 0, 0, kLimit, ok));
  // 64 bytes of weight against a 32-byte budget.
  seeds->emplace_back("register_over_budget",
                      EncodeRequestInput(Call::kRegisterWeight, 0, 0, 5, ok));
  v1::RegisterWeightHeader rank3 = h;
  rank3.mutable_weight()->add_shape(2);
  seeds->emplace_back("register_rank3",
                      EncodeRequestInput(Call::kRegisterWeight, 0, 0, kLimit,
                                         {HeaderMessage<v1::RegisterWeightRequest>(rank3)}));
  v1::RegisterWeightHeader negative = h;
  negative.mutable_weight()->set_shape(0, -8);
  seeds->emplace_back("register_negative_dim",
                      EncodeRequestInput(Call::kRegisterWeight, 0, 0, kLimit,
                                         {HeaderMessage<v1::RegisterWeightRequest>(negative)}));
}

int WriteSeeds(const std::filesystem::path& dir) {
  Seeds seeds;
  LogitsSeeds(&seeds);
  BackwardSeeds(&seeds);
  CastSeeds(&seeds);
  CrossEntropySeeds(&seeds);
  RegisterSeeds(&seeds);
  std::filesystem::create_directories(dir);
  for (const auto& [name, bytes] : seeds) {
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
      return 1;
    }
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
  return 0;
}

bool Replay(const std::filesystem::path& file, bool verbose) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", file.c_str());
    return false;
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const absl::Status s =
      RunRequest(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  if (verbose) std::printf("%s: %s\n", file.filename().c_str(), s.ToString().c_str());
  return true;
}

}  // namespace
}  // namespace logitd::fuzz

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc == 3 && std::strcmp(argv[1], "--write_seeds") == 0) {
    return logitd::fuzz::WriteSeeds(argv[2]);
  }
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIR... | --write_seeds DIR\n", argv[0]);
    return 2;
  }
  std::size_t replayed = 0;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--verbose") == 0) {
      verbose = true;
      continue;
    }
    std::error_code ec;
    if (fs::is_directory(argv[i], ec)) {
      std::vector<fs::path> files;
      for (const fs::directory_entry& e : fs::directory_iterator(argv[i])) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      for (const fs::path& f : files) {
        if (!logitd::fuzz::Replay(f, verbose)) return 1;
        ++replayed;
      }
    } else {
      if (!logitd::fuzz::Replay(argv[i], verbose)) return 1;
      ++replayed;
    }
  }
  if (replayed == 0) {
    std::fprintf(stderr, "no inputs found\n");
    return 1;
  }
  std::printf("replayed %zu inputs, no invariant violated\n", replayed);
  return 0;
}
