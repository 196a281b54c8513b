// Runs the chunk message fuzzer's entry point without libFuzzer: over built-in
// seeds (chunk messages as protobuf writes them, and messages that are not
// chunks), then over every file named (or in a directory named). Exit 0 when
// none trips an invariant (a violation aborts).
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "logitd/v1/logitd.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

void Run(const std::string& bytes) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
}

std::vector<std::string> Seeds() {
  std::vector<std::string> messages;
  for (const std::uint64_t offset :
       {std::uint64_t{0}, std::uint64_t{300}, std::uint64_t{1} << 40}) {
    logitd::v1::LogitsResponse r;
    r.mutable_chunk()->set_name("y");
    r.mutable_chunk()->set_offset(offset);
    r.mutable_chunk()->set_data(std::string(200 + offset % 7, '\x5a'));
    messages.push_back(r.SerializeAsString());
  }
  logitd::v1::LogitsResponse empty_name;
  empty_name.mutable_chunk()->set_data("abc");
  messages.push_back(empty_name.SerializeAsString());
  logitd::v1::LogitsResponse named;
  named.mutable_chunk()->set_name("y");
  named.mutable_chunk()->set_data("abc");
  std::string bad_name = named.SerializeAsString();
  bad_name[4] = '\xff';  // the name, not UTF-8: protobuf refuses it
  messages.push_back(bad_name);
  logitd::v1::LogitsResponse result;
  result.mutable_result()->mutable_y()->set_name("y");
  messages.push_back(result.SerializeAsString());
  logitd::v1::LogitsResponse digest;
  digest.mutable_digest()->set_name("y");
  digest.mutable_digest()->set_xxh3(7);
  messages.push_back(digest.SerializeAsString());
  std::vector<std::string> seeds;
  for (const std::string& m : messages) {
    for (const std::string& prefix :
         {std::string("\x00", 1), std::string("\x01\x80", 2), std::string("\x03\x01\x40\xfe", 4)}) {
      seeds.push_back(prefix + m);
      seeds.push_back(prefix + m.substr(0, m.size() / 2));  // truncated
    }
  }
  return seeds;
}

}  // namespace

int main(int argc, char** argv) {
  for (const std::string& seed : Seeds()) Run(seed);
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(arg)) {
      for (const auto& e : std::filesystem::directory_iterator(arg)) files.push_back(e.path());
    } else {
      files.push_back(arg);
    }
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      Run(std::string(std::istreambuf_iterator<char>(in), {}));
    }
  }
  return 0;
}
