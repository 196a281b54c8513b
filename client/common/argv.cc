#include "client/common/argv.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace logitd::argv {

std::optional<Flag> Resolve(const Word& word, const FlagLookup& lookup) {
  if (!word.is_flag || !lookup) return std::nullopt;
  Flag flag;
  flag.written = word.name;
  flag.value = word.value;
  if (std::optional<FlagType> type = lookup(word.name); type.has_value()) {
    flag.name = word.name;
    flag.type = *type;
    return flag;
  }
  // --noNAME is the negation of a boolean NAME only; a flag literally named
  // noNAME was matched above.
  if (!absl::StartsWith(word.name, "no")) return std::nullopt;
  const absl::string_view base = absl::string_view(word.name).substr(2);
  if (lookup(base) != FlagType::kBool) return std::nullopt;
  flag.name = std::string(base);
  flag.type = FlagType::kBool;
  flag.negated = true;
  return flag;
}

Reader::Reader(std::vector<std::string> words) : words_(std::move(words)) {}

std::optional<Word> Reader::Next() {
  while (next_ < words_.size()) {
    Word word;
    word.index = next_++;
    word.text = words_[word.index];
    const std::string& text = word.text;
    if (only_positional_ || text.size() < 2 || text[0] != '-') return word;
    if (text == "--") {
      only_positional_ = true;
      continue;
    }
    word.is_flag = true;
    absl::string_view body(text);
    body.remove_prefix(text[1] == '-' ? 2 : 1);
    if (const std::size_t eq = body.find('='); eq != absl::string_view::npos) {
      word.value = std::string(body.substr(eq + 1));
      body = body.substr(0, eq);
    }
    word.name = std::string(body);
    return word;
  }
  return std::nullopt;
}

absl::StatusOr<std::string> Reader::Value(const Flag& flag) {
  if (flag.type == FlagType::kBool) {
    if (flag.negated) {
      if (flag.value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag.written, " takes no value"));
      }
      return std::string("false");
    }
    return flag.value.value_or("true");
  }
  if (flag.value.has_value()) return *flag.value;
  if (next_ >= words_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag.written, " needs a value"));
  }
  return words_[next_++];
}

void Reader::SkipValue(const Flag& flag) {
  if (flag.type == FlagType::kValue && !flag.value.has_value() && next_ < words_.size()) ++next_;
}

}  // namespace logitd::argv
