#include "client/validate/baseline.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/validate/random.h"
#include "logitd/reference/numerics.h"

namespace logitd::validate {
namespace {

constexpr char kFormat[] = "logitd-golden-baseline";
// 2 added the platform's SMs and driver and each case's GEMM configurations;
// format 1 files are still read.
constexpr int kFormatVersion = 2;

std::string Hex64(std::uint64_t v) { return absl::StrFormat("%016x", v); }

absl::StatusOr<std::uint64_t> ParseHex64(const nlohmann::json& j, absl::string_view what) {
  if (!j.is_string())
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected a hex string"));
  std::uint64_t v = 0;
  std::string s = j.get<std::string>();
  if (s.rfind("0x", 0) == 0) s = s.substr(2);
  if (s.empty() || s.size() > 16 || !absl::SimpleHexAtoi(s, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", s, "' is not a 64-bit hex digest"));
  }
  return v;
}

std::int64_t BlockElementsFor(const Tensor& t) {
  if (t.rank() >= 2) return t.dim(t.rank() - 1);
  return std::min<std::int64_t>(1024, std::max<std::int64_t>(1, t.numel()));
}

std::vector<std::int64_t> SampleIndices(const std::string& name, std::int64_t n) {
  std::set<std::int64_t> picked = {0, n - 1};
  Rng rng = Rng::Stream(static_cast<std::uint64_t>(n), name);
  for (int i = 0; i < kSamplesPerOutput && static_cast<std::int64_t>(picked.size()) < n; ++i) {
    picked.insert(rng.UniformInt(0, n - 1));
  }
  return std::vector<std::int64_t>(picked.begin(), picked.end());
}

nlohmann::ordered_json PlatformJson(const Platform& p) {
  nlohmann::ordered_json j;
  j["backend"] = p.backend;
  j["device_name"] = p.device_name;
  j["compute_capability"] = p.compute_capability;
  j["multiprocessors"] = p.multiprocessors;
  j["driver_version"] = p.driver_version;
  j["cuda_runtime_version"] = p.cuda_runtime_version;
  j["cublaslt_version"] = p.cublaslt_version;
  j["blas_version"] = p.blas_version;
  return j;
}

std::string StringField(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

absl::StatusOr<OutputRecord> OutputFromJson(const nlohmann::json& j, const std::string& where) {
  OutputRecord o;
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": not an object"));
  o.name = StringField(j, "name");
  absl::StatusOr<DType> dtype = ParseDType(StringField(j, "dtype"));
  if (!dtype.ok())
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", dtype.status().message()));
  o.dtype = *dtype;
  if (!j.contains("shape") || !j["shape"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing shape"));
  }
  for (const auto& d : j["shape"]) {
    if (!d.is_number_integer())
      return absl::InvalidArgumentError(absl::StrCat(where, ": bad shape"));
    o.shape.push_back(d.get<std::int64_t>());
  }
  absl::StatusOr<std::int64_t> numel = CheckedElementCount(o.shape);
  if (!numel.ok())
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", numel.status().message()));
  absl::StatusOr<std::uint64_t> digest =
      ParseHex64(j.value("xxh3", nlohmann::json()), where + ".xxh3");
  if (!digest.ok()) return digest.status();
  o.xxh3 = *digest;
  o.block_elements = j.value("block_elements", std::int64_t{0});
  if (o.block_elements <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": block_elements must be >= 1"));
  }
  if (j.contains("block_xxh3")) {
    for (const auto& b : j["block_xxh3"]) {
      absl::StatusOr<std::uint64_t> v = ParseHex64(b, where + ".block_xxh3");
      if (!v.ok()) return v.status();
      o.block_xxh3.push_back(*v);
    }
  }
  if (j.contains("samples")) {
    for (const auto& s : j["samples"]) {
      if (!s.is_array() || s.size() != 2 || !s[0].is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": samples are [index, \"bits\"] pairs"));
      }
      absl::StatusOr<std::uint64_t> bits = ParseHex64(s[1], where + ".samples");
      if (!bits.ok()) return bits.status();
      const std::int64_t index = s[0].get<std::int64_t>();
      if (index < 0 || index >= *numel) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": sample index ", index, " out of range"));
      }
      o.samples.emplace_back(index, static_cast<std::uint32_t>(*bits));
    }
  }
  if (j.contains("values_base64")) {
    std::string raw;
    if (!j["values_base64"].is_string() ||
        !absl::Base64Unescape(j["values_base64"].get<std::string>(), &raw)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": values_base64 is not base64"));
    }
    if (raw.size() != static_cast<std::size_t>(*numel) * ElementSize(o.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": values_base64 holds ", raw.size(),
                                                     " bytes, the shape needs ",
                                                     *numel * ElementSize(o.dtype)));
    }
    o.values = std::move(raw);
  }
  return o;
}

std::uint32_t BitsAt(const std::string& raw, DType dtype, std::int64_t i) {
  if (dtype == DType::kBf16) {
    std::uint16_t v;
    std::memcpy(&v, raw.data() + i * 2, 2);
    return v;
  }
  std::uint32_t v;
  std::memcpy(&v, raw.data() + i * 4, 4);
  return v;
}

std::int64_t Ulp(DType dtype, std::uint32_t a, std::uint32_t b) {
  return dtype == DType::kBf16 ? UlpDistanceBf16(static_cast<Bf16Bits>(a), static_cast<Bf16Bits>(b))
                               : UlpDistanceFp32(a, b);
}

std::string UlpText(std::int64_t ulp) {
  return ulp == std::numeric_limits<std::int64_t>::max() ? std::string("inf (NaN vs number)")
                                                         : absl::StrCat(ulp);
}

}  // namespace

Platform PlatformOf(const client::ServerInfo& info) {
  Platform p;
  p.backend = info.backend;
  p.device_name = info.device_name;
  p.compute_capability = info.compute_capability;
  p.multiprocessors = info.multiprocessor_count > 0 ? absl::StrCat(info.multiprocessor_count) : "";
  p.driver_version = info.driver_version;
  p.cuda_runtime_version = info.cuda_runtime_version;
  p.cublaslt_version = info.cublaslt_version;
  p.blas_version = info.blas_version;
  return p;
}

std::string PlatformDifference(const Platform& a, const Platform& b) {
  std::vector<std::string> diffs;
  auto cmp = [&](const char* what, const std::string& x, const std::string& y) {
    if (x != y) diffs.push_back(absl::StrCat(what, ": '", x, "' vs '", y, "'"));
  };
  cmp("backend", a.backend, b.backend);
  cmp("device", a.device_name, b.device_name);
  cmp("compute capability", a.compute_capability, b.compute_capability);
  // Not recorded by format 1: compared only when the baseline has them.
  if (!a.multiprocessors.empty()) cmp("SMs", a.multiprocessors, b.multiprocessors);
  if (!a.driver_version.empty()) cmp("driver", a.driver_version, b.driver_version);
  cmp("CUDA runtime", a.cuda_runtime_version, b.cuda_runtime_version);
  cmp("cuBLASLt", a.cublaslt_version, b.cublaslt_version);
  cmp("BLAS", a.blas_version, b.blas_version);
  return absl::StrJoin(diffs, "; ");
}

std::string PlatformString(const Platform& p) {
  std::string s = absl::StrCat("backend ", p.backend, ", device '", p.device_name, "'");
  if (!p.compute_capability.empty()) absl::StrAppend(&s, " (sm ", p.compute_capability, ")");
  if (!p.multiprocessors.empty() && p.backend == "cuda") {
    absl::StrAppend(&s, ", ", p.multiprocessors, " SMs");
  }
  if (!p.driver_version.empty()) absl::StrAppend(&s, ", driver ", p.driver_version);
  if (!p.cuda_runtime_version.empty()) absl::StrAppend(&s, ", CUDA ", p.cuda_runtime_version);
  if (!p.cublaslt_version.empty()) absl::StrAppend(&s, ", cuBLASLt ", p.cublaslt_version);
  if (!p.blas_version.empty()) absl::StrAppend(&s, ", ", p.blas_version);
  return s;
}

const CaseRecord* Baseline::Find(const std::string& case_name) const {
  for (const CaseRecord& c : cases) {
    if (c.name == case_name) return &c;
  }
  return nullptr;
}

OutputRecord RecordOutput(const std::string& name, const Tensor& t) {
  OutputRecord o;
  o.name = name;
  o.dtype = t.dtype();
  o.shape = t.shape();
  o.xxh3 = t.Digest();
  o.block_elements = BlockElementsFor(t);
  const std::size_t es = ElementSize(t.dtype());
  for (std::int64_t b = 0; b < t.numel(); b += o.block_elements) {
    const std::int64_t n = std::min(o.block_elements, t.numel() - b);
    o.block_xxh3.push_back(
        Xxh3(t.bytes() + b * static_cast<std::int64_t>(es), static_cast<std::size_t>(n) * es));
  }
  for (std::int64_t i : SampleIndices(name, t.numel()))
    o.samples.emplace_back(i, ElementBits(t, i));
  if (t.numel() <= kFullValuesMaxElements) {
    o.values = std::string(reinterpret_cast<const char*>(t.bytes()), t.nbytes());
  }
  return o;
}

nlohmann::ordered_json BaselineToJson(const Baseline& baseline) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["format_version"] = kFormatVersion;
  j["recorded_at"] = baseline.recorded_at;
  j["platform"] = PlatformJson(baseline.platform);
  j["server"] = baseline.server;
  nlohmann::ordered_json cases = nlohmann::ordered_json::array();
  for (const CaseRecord& c : baseline.cases) {
    nlohmann::ordered_json cj;
    cj["name"] = c.name;
    cj["inputs_xxh3"] = Hex64(c.inputs_xxh3);
    if (!c.gemms.empty()) cj["gemms"] = c.gemms;
    if (c.within_bounds.has_value()) {
      cj["within_bounds"] = *c.within_bounds;
      cj["worst_bound_fraction"] = c.worst_bound_fraction;
    }
    nlohmann::ordered_json outputs = nlohmann::ordered_json::array();
    for (const OutputRecord& o : c.outputs) {
      nlohmann::ordered_json oj;
      oj["name"] = o.name;
      oj["dtype"] = DTypeName(o.dtype);
      oj["shape"] = o.shape;
      oj["xxh3"] = Hex64(o.xxh3);
      oj["block_elements"] = o.block_elements;
      nlohmann::ordered_json blocks = nlohmann::ordered_json::array();
      for (std::uint64_t b : o.block_xxh3) blocks.push_back(Hex64(b));
      oj["block_xxh3"] = std::move(blocks);
      nlohmann::ordered_json samples = nlohmann::ordered_json::array();
      for (const auto& [i, bits] : o.samples) samples.push_back({i, BitsHex(bits, o.dtype)});
      oj["samples"] = std::move(samples);
      if (o.values.has_value()) oj["values_base64"] = absl::Base64Escape(*o.values);
      outputs.push_back(std::move(oj));
    }
    cj["outputs"] = std::move(outputs);
    cases.push_back(std::move(cj));
  }
  j["cases"] = std::move(cases);
  return j;
}

absl::StatusOr<Baseline> BaselineFromJson(const nlohmann::json& j) {
  if (!j.is_object() || j.value("format", std::string()) != kFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a logitd golden baseline (expected \"format\": \"", kFormat, "\")"));
  }
  const int version = j.value("format_version", 0);
  if (version != kFormatVersion && version != 1) {
    return absl::InvalidArgumentError(absl::StrCat("baseline format_version ", version,
                                                   " is not supported (expected 1 or ",
                                                   kFormatVersion, ")"));
  }
  Baseline b;
  b.recorded_at = StringField(j, "recorded_at");
  if (j.contains("server")) b.server = j["server"];
  const nlohmann::json p = j.value("platform", nlohmann::json::object());
  b.platform.backend = StringField(p, "backend");
  b.platform.device_name = StringField(p, "device_name");
  b.platform.compute_capability = StringField(p, "compute_capability");
  b.platform.multiprocessors = StringField(p, "multiprocessors");
  b.platform.driver_version = StringField(p, "driver_version");
  b.platform.cuda_runtime_version = StringField(p, "cuda_runtime_version");
  b.platform.cublaslt_version = StringField(p, "cublaslt_version");
  b.platform.blas_version = StringField(p, "blas_version");
  if (!j.contains("cases") || !j["cases"].is_array()) {
    return absl::InvalidArgumentError("baseline has no \"cases\" array");
  }
  for (const auto& cj : j["cases"]) {
    CaseRecord c;
    c.name = StringField(cj, "name");
    const std::string where = absl::StrCat("case '", c.name, "'");
    absl::StatusOr<std::uint64_t> inputs =
        ParseHex64(cj.value("inputs_xxh3", nlohmann::json()), where + ".inputs_xxh3");
    if (!inputs.ok()) return inputs.status();
    c.inputs_xxh3 = *inputs;
    c.gemms = StringField(cj, "gemms");
    if (cj.contains("within_bounds") && cj["within_bounds"].is_boolean()) {
      c.within_bounds = cj["within_bounds"].get<bool>();
      const nlohmann::json worst = cj.value("worst_bound_fraction", nlohmann::json());
      c.worst_bound_fraction = worst.is_number() ? worst.get<double>() : 0.0;
    }
    if (!cj.contains("outputs") || !cj["outputs"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no outputs"));
    }
    for (const auto& oj : cj["outputs"]) {
      absl::StatusOr<OutputRecord> o =
          OutputFromJson(oj, absl::StrCat(where, " output '", StringField(oj, "name"), "'"));
      if (!o.ok()) return o.status();
      c.outputs.push_back(*std::move(o));
    }
    b.cases.push_back(std::move(c));
  }
  return b;
}

absl::StatusOr<Baseline> ReadBaseline(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open baseline file '", path, "'"));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("baseline file '", path, "' is not valid JSON"));
  }
  absl::StatusOr<Baseline> b = BaselineFromJson(j);
  if (!b.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("baseline file '", path, "': ", b.status().message()));
  }
  return b;
}

absl::Status WriteBaseline(const std::string& path, const Baseline& baseline) {
  const std::string text = BaselineToJson(baseline).dump(
      1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  std::ofstream out(path, std::ios::trunc);
  out << text << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write baseline file '", path, "'"));
  return absl::OkStatus();
}

namespace {

// With the record's values stored: every element compared, the first
// difference named (or, when none differs, the recorded digest called
// altered).
void CompareStoredValues(const OutputRecord& rec, const Tensor& cur, const std::string& head,
                         OutputComparison* c) {
  const std::string& raw = *rec.values;
  const DType dtype = rec.dtype;
  c->differing_elements = 0;
  std::int64_t first = -1;
  for (std::int64_t i = 0; i < cur.numel(); ++i) {
    const std::uint32_t was = BitsAt(raw, dtype, i);
    const std::uint32_t now = ElementBits(cur, i);
    if (was == now) continue;
    if (c->differing_elements++ == 0) first = i;
    c->max_ulp = std::max(c->max_ulp, Ulp(dtype, now, was));
  }
  if (c->differing_elements == 0) {
    const std::uint64_t stored = Xxh3(raw.data(), raw.size());
    c->message = absl::StrCat(head, "; yet all ", cur.numel(),
                              " stored values equal this output (their digest is ", Hex64(stored),
                              "): the baseline's recorded digest was altered or corrupted");
    return;
  }
  c->message = absl::StrCat(
      head, "; ", c->differing_elements, " of ", cur.numel(), " elements differ, largest distance ",
      UlpText(c->max_ulp), " ulp; first at ", IndexString(first, rec.shape), ": baseline ",
      BitsHex(BitsAt(raw, dtype, first), dtype), ", now ", BitsHex(ElementBits(cur, first), dtype));
}

}  // namespace

OutputComparison CompareOutput(const OutputRecord& rec, const Tensor& cur) {
  OutputComparison c;
  if (cur.dtype() != rec.dtype || cur.shape() != rec.shape) {
    c.message = absl::StrCat(rec.name, ": baseline has ", DTypeName(rec.dtype), " ",
                             ShapeString(rec.shape), ", the server returned ",
                             DTypeName(cur.dtype()), " ", ShapeString(cur.shape()));
    return c;
  }
  const std::uint64_t digest = cur.Digest();
  const DType dtype = rec.dtype;
  const std::size_t es = ElementSize(dtype);

  // Blocks and samples are compared whatever happens, for the figures.
  c.total_blocks = static_cast<std::int64_t>(rec.block_xxh3.size());
  std::int64_t first_block = -1;
  for (std::int64_t b = 0; b < c.total_blocks; ++b) {
    const std::int64_t begin = b * rec.block_elements;
    if (begin >= cur.numel()) break;
    const std::int64_t n = std::min(rec.block_elements, cur.numel() - begin);
    const std::uint64_t h =
        Xxh3(cur.bytes() + begin * static_cast<std::int64_t>(es), static_cast<std::size_t>(n) * es);
    if (h != rec.block_xxh3[static_cast<std::size_t>(b)]) {
      if (c.differing_blocks++ == 0) first_block = b;
    }
  }
  std::int64_t sample_max_ulp = 0;
  for (const auto& [i, bits] : rec.samples) {
    ++c.sampled;
    const std::uint32_t now = ElementBits(cur, i);
    if (now != bits) {
      ++c.sampled_differing;
      sample_max_ulp = std::max(sample_max_ulp, Ulp(dtype, now, bits));
    }
  }

  if (digest == rec.xxh3) {
    c.equal = true;
    c.differing_elements = 0;
    c.message = absl::StrCat(rec.name, ": digest ", Hex64(digest), " matches");
    return c;
  }

  const std::string head =
      absl::StrCat(rec.name, " ", DTypeName(dtype), " ", ShapeString(rec.shape), ": digest ",
                   Hex64(digest), " differs from the baseline's ", Hex64(rec.xxh3));
  if (rec.values.has_value()) {
    CompareStoredValues(rec, cur, head, &c);
    return c;
  }

  c.max_ulp = sample_max_ulp;
  if (c.differing_blocks == 0) {
    c.message = absl::StrCat(head, "; yet every one of its ", c.total_blocks,
                             " block digests matches: the baseline's recorded digest was "
                             "altered or corrupted");
  } else {
    const std::int64_t begin = first_block * rec.block_elements;
    c.message = absl::StrCat(
        head, "; ", c.differing_blocks, " of ", c.total_blocks, " blocks of ", rec.block_elements,
        " elements differ (first: elements ", IndexString(begin, rec.shape), " onwards), so 1 to ",
        c.differing_blocks * rec.block_elements, " elements differ; ", c.sampled_differing, " of ",
        c.sampled, " sampled values differ, largest distance ", UlpText(sample_max_ulp), " ulp");
  }
  return c;
}

}  // namespace logitd::validate
