// Tests of the safetensors reader and writer: round trips, the on-disk layout
// the reference implementation expects, and rejection of corrupt files.
#include "logitd/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "logitd/bf16.h"
#include "tests/common/seeded_tensors.h"

namespace logitd {
namespace {

using testing::NormalBf16;
using testing::NormalFp32;

// A file name unique to this test and process, removed at scope exit.
class TempFile {
 public:
  TempFile() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = absl::StrCat(::testing::TempDir(), "/logitd_safetensors_", info->name(), "_", getpid(),
                         ".safetensors");
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string LengthPrefix(std::uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>(n >> (8 * i));
  return s;
}

// A file laid out by hand, as another writer would produce it.
std::string HandMade(const std::string& header_json, const std::string& data) {
  return LengthPrefix(header_json.size()) + header_json + data;
}

void ExpectSameTensor(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.nbytes(), want.nbytes());
  EXPECT_EQ(std::memcmp(got.bytes(), want.bytes(), want.nbytes()), 0);
}

TEST(Safetensors, RoundTripBf16F32I64WithMetadata) {
  TempFile f;
  const Tensor w = NormalBf16({33, 17}, 1);
  const Tensor b = NormalFp32({33}, 2);
  Tensor ids(DType::kInt64, {2, 3});
  const std::int64_t id_values[] = {0,
                                    -1,
                                    std::numeric_limits<std::int64_t>::max(),
                                    std::numeric_limits<std::int64_t>::min(),
                                    42,
                                    1 << 30};
  std::memcpy(ids.bytes(), id_values, sizeof id_values);
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"seed", "1234"}};
  absl::Status s =
      WriteSafetensors(f.path(), {{"lm_head.weight", &w}, {"bias", &b}, {"ids", &ids}}, meta);
  ASSERT_TRUE(s.ok()) << s;

  absl::StatusOr<std::vector<std::string>> names = ListSafetensors(f.path());
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, (std::vector<std::string>{"lm_head.weight", "bias", "ids"}));

  for (const auto& [name, want] : std::vector<std::pair<std::string, const Tensor*>>{
           {"lm_head.weight", &w}, {"bias", &b}, {"ids", &ids}}) {
    absl::StatusOr<Tensor> got = ReadSafetensorsTensor(f.path(), name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status();
    ExpectSameTensor(*got, *want);
  }
  absl::StatusOr<std::map<std::string, std::string>> got_meta = ReadSafetensorsMetadata(f.path());
  ASSERT_TRUE(got_meta.ok()) << got_meta.status();
  EXPECT_EQ(*got_meta, meta);
}

TEST(Safetensors, StatGivesDtypeAndShapeWithoutData) {
  TempFile file;
  const Tensor w = NormalBf16({3, 5}, 7);
  const Tensor b = NormalFp32({4}, 8);
  ASSERT_TRUE(WriteSafetensors(file.path(), {{"w", &w}, {"b", &b}}).ok());
  absl::StatusOr<SafetensorsTensorInfo> info = StatSafetensorsTensor(file.path(), "w");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->dtype, "BF16");
  EXPECT_EQ(info->shape, (std::vector<std::int64_t>{3, 5}));
  info = StatSafetensorsTensor(file.path(), "b");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->dtype, "F32");
  EXPECT_EQ(info->shape, (std::vector<std::int64_t>{4}));

  // A dtype the reader refuses is still described.
  WriteAll(file.path(),
           HandMade(R"({"u":{"dtype":"U8","shape":[2,2],"data_offsets":[0,4]}})", "abcd"));
  info = StatSafetensorsTensor(file.path(), "u");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->dtype, "U8");

  info = StatSafetensorsTensor(file.path(), "missing");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(info.status().message().find("u"), absl::string_view::npos) << info.status();
}

TEST(Safetensors, FileLayoutMatchesTheFormat) {
  TempFile f;
  const Tensor w = NormalBf16({3, 5}, 3);  // 30 bytes: the next tensor starts unaligned
  const Tensor b = NormalFp32({4}, 4);
  ASSERT_TRUE(WriteSafetensors(f.path(), {{"w", &w}, {"b", &b}}, {{"k", "v"}}).ok());
  const std::string bytes = ReadAll(f.path());
  ASSERT_GE(bytes.size(), 8u);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) {
    n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  }
  // Header padded with spaces so the data starts 8-byte aligned.
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + w.nbytes() + b.nbytes());
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  const nlohmann::json j = nlohmann::json::parse(header);
  EXPECT_EQ(j["w"]["dtype"], "BF16");
  EXPECT_EQ(j["w"]["shape"], nlohmann::json::array({3, 5}));
  EXPECT_EQ(j["w"]["data_offsets"], nlohmann::json::array({0, 30}));
  EXPECT_EQ(j["b"]["dtype"], "F32");
  EXPECT_EQ(j["b"]["data_offsets"], nlohmann::json::array({30, 46}));
  EXPECT_EQ(j["__metadata__"]["k"], "v");
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, w.bytes(), w.nbytes()), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + 30, b.bytes(), b.nbytes()), 0);
}

TEST(Safetensors, F16IsReadAsExactFp32) {
  TempFile f;
  // fp16 patterns and their values computed by hand.
  const std::vector<std::uint16_t> half = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff,
                                           0x8000, 0x7c00, 0xfc00, 0x3555, 0x0400};
  const std::vector<float> want = {1.0f,
                                   -2.0f,
                                   65504.0f,
                                   std::ldexp(1.0f, -24),
                                   std::ldexp(1023.0f, -24),
                                   -0.0f,
                                   std::numeric_limits<float>::infinity(),
                                   -std::numeric_limits<float>::infinity(),
                                   0.333251953125f,
                                   std::ldexp(1.0f, -14)};
  const std::vector<std::uint16_t> nan = {0x7e00};
  std::string data(reinterpret_cast<const char*>(half.data()), half.size() * 2);
  data.append(reinterpret_cast<const char*>(nan.data()), 2);
  WriteAll(f.path(), HandMade(R"({"h":{"dtype":"F16","shape":[2,5],"data_offsets":[0,20]},)"
                              R"("n":{"dtype":"F16","shape":[],"data_offsets":[20,22]}})",
                              data));
  absl::StatusOr<Tensor> t = ReadSafetensorsTensor(f.path(), "h");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype(), DType::kFp32);
  EXPECT_EQ(t->shape(), (std::vector<std::int64_t>{2, 5}));
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(FloatBits(t->data<float>()[i]), FloatBits(want[i])) << i;
  }
  // A scalar (shape []) holding NaN.
  absl::StatusOr<Tensor> n = ReadSafetensorsTensor(f.path(), "n");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->numel(), 1);
  EXPECT_TRUE(std::isnan(n->data<float>()[0]));
}

TEST(Safetensors, ReadsAHandMadeFileWithUnpaddedHeaderAndI32) {
  TempFile f;
  const std::vector<std::int32_t> v = {7, -8, 2147483647};
  const std::string data(reinterpret_cast<const char*>(v.data()), 12);
  WriteAll(f.path(), HandMade(R"({"a":{"dtype":"I32","shape":[3],"data_offsets":[0,12]}})", data));
  absl::StatusOr<Tensor> t = ReadSafetensorsTensor(f.path(), "a");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype(), DType::kInt32);
  EXPECT_EQ(t->data<std::int32_t>()[2], 2147483647);
  EXPECT_EQ(t->data<std::int32_t>()[1], -8);
}

TEST(Safetensors, CorruptHeaderLengthIsDataLoss) {
  TempFile f;
  const Tensor w = NormalBf16({4, 4}, 5);
  ASSERT_TRUE(WriteSafetensors(f.path(), {{"w", &w}}).ok());
  std::string bytes = ReadAll(f.path());

  // Past the end of the file.
  std::string longer = bytes;
  longer.replace(0, 8, LengthPrefix(bytes.size()));
  WriteAll(f.path(), longer);
  absl::Status s = ListSafetensors(f.path()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("header length"), absl::string_view::npos) << s;

  // Absurdly large (what a non-safetensors file typically looks like).
  std::string huge = bytes;
  huge.replace(0, 8, LengthPrefix(std::uint64_t{1} << 40));
  WriteAll(f.path(), huge);
  EXPECT_EQ(ReadSafetensorsTensor(f.path(), "w").status().code(), absl::StatusCode::kDataLoss);

  // Shorter than the length field itself.
  WriteAll(f.path(), "abc");
  EXPECT_EQ(ListSafetensors(f.path()).status().code(), absl::StatusCode::kDataLoss);

  // A length that cuts the JSON short.
  std::string cut = bytes;
  cut.replace(0, 8, LengthPrefix(10));
  WriteAll(f.path(), cut);
  s = ListSafetensors(f.path()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("JSON"), absl::string_view::npos) << s;
}

TEST(Safetensors, OffsetsOutOfBoundsAreDataLoss) {
  TempFile f;
  const std::string data(16, 'x');
  // End past the data section.
  WriteAll(f.path(), HandMade(R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", data));
  absl::Status s = ReadSafetensorsTensor(f.path(), "a").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("data_offsets [0, 32]"), absl::string_view::npos) << s;
  // Begin after end.
  WriteAll(f.path(), HandMade(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", data));
  EXPECT_EQ(ListSafetensors(f.path()).status().code(), absl::StatusCode::kDataLoss);
  // In bounds but not shape x dtype: [2, 3] F32 is 24 bytes, not 16.
  WriteAll(f.path(),
           HandMade(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", data));
  s = ReadSafetensorsTensor(f.path(), "a").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("expected 24 bytes"), absl::string_view::npos) << s;
  // Negative and non-integer offsets.
  WriteAll(f.path(), HandMade(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[-4,12]}})", data));
  EXPECT_EQ(ListSafetensors(f.path()).status().code(), absl::StatusCode::kDataLoss);
  WriteAll(f.path(),
           HandMade(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0.5,16]}})", data));
  EXPECT_EQ(ListSafetensors(f.path()).status().code(), absl::StatusCode::kDataLoss);
}

TEST(Safetensors, MalformedHeaderJsonIsDataLoss) {
  TempFile f;
  const std::string data(8, 'x');
  for (const char* header :
       {R"({"a":{"dtype":"F32","shape":[2],)", R"([1, 2, 3])",
        R"({"a":{"shape":[2],"data_offsets":[0,8]}})",
        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", R"({"__metadata__":{"k":1}})"}) {
    WriteAll(f.path(), HandMade(header, data));
    EXPECT_EQ(ListSafetensors(f.path()).status().code(), absl::StatusCode::kDataLoss) << header;
  }
}

TEST(Safetensors, MissingTensorIsNotFoundListingNames) {
  TempFile f;
  const Tensor a = NormalFp32({2}, 6);
  const Tensor b = NormalFp32({3}, 7);
  ASSERT_TRUE(WriteSafetensors(f.path(), {{"alpha", &a}, {"beta", &b}}).ok());
  absl::Status s = ReadSafetensorsTensor(f.path(), "gamma").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("'gamma'"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("alpha, beta"), absl::string_view::npos) << s;
}

TEST(Safetensors, MissingFileIsNotFound) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/logitd_no_such_file_", getpid());
  EXPECT_EQ(ListSafetensors(path).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadSafetensorsTensor(path, "w").status().code(), absl::StatusCode::kNotFound);
}

TEST(Safetensors, UnsupportedDTypeIsInvalidArgumentNamingIt) {
  TempFile f;
  const std::string data(16, 'x');
  WriteAll(f.path(), HandMade(R"({"d":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", data));
  // Listing works: the file is well-formed.
  absl::StatusOr<std::vector<std::string>> names = ListSafetensors(f.path());
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, std::vector<std::string>{"d"});
  absl::Status s = ReadSafetensorsTensor(f.path(), "d").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("F64"), absl::string_view::npos) << s;
}

TEST(Safetensors, WriteRejectsDuplicateReservedAndNullWithInvalidArgument) {
  TempFile f;
  const Tensor a = NormalFp32({2}, 8);
  EXPECT_EQ(WriteSafetensors(f.path(), {{"a", &a}, {"a", &a}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensors(f.path(), {{"__metadata__", &a}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensors(f.path(), {{"a", nullptr}}).code(),
            absl::StatusCode::kInvalidArgument);
  const Tensor empty;
  EXPECT_EQ(WriteSafetensors(f.path(), {{"e", &empty}}).code(), absl::StatusCode::kInvalidArgument);
  // Nothing was left behind by the failed writes.
  EXPECT_EQ(ListSafetensors(f.path()).status().code(), absl::StatusCode::kNotFound);
}

TEST(Safetensors, WriteIntoMissingDirectoryIsNotFound) {
  const Tensor a = NormalFp32({2}, 9);
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/logitd_no_such_dir_", getpid(), "/x.safetensors");
  EXPECT_EQ(WriteSafetensors(path, {{"a", &a}}).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace logitd
