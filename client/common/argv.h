// Word-level reading of a command line in the spellings absl users expect:
// --name=value, --name value, -name, --flag, --noflag, --flag=false, and
// "--", after which every word is positional. logitctl and its validation
// harness both read their words through it, so the two accept the same
// forms. Which flags exist, what they mean and how an unknown one is
// reported stay with the caller, which passes a lookup of its flags' types.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace logitd::argv {

enum class FlagType { kBool, kValue };

// The type of the flag `name` in some set of flags; nullopt when the set has
// no flag of that name.
using FlagLookup = std::function<std::optional<FlagType>(absl::string_view name)>;

// One word of a command line, as Reader::Next returns it.
struct Word {
  std::size_t index = 0;  // position in the reader's words
  std::string text;       // verbatim
  // -NAME or --NAME, either with =VALUE, before any "--". Every other word,
  // "-" alone included, is positional.
  bool is_flag = false;
  std::string name;                  // NAME
  std::optional<std::string> value;  // VALUE, when written after '='
};

// A flag word matched against a FlagLookup.
struct Flag {
  std::string written;  // the name as written, e.g. "noquick"
  std::string name;     // the flag it sets, e.g. "quick"
  FlagType type = FlagType::kValue;
  bool negated = false;              // written noNAME for the boolean NAME
  std::optional<std::string> value;  // as Word::value
};

// The flag `word` names in `lookup`: NAME itself, else, when NAME is noX for
// a boolean X, X negated. nullopt for a positional word, an empty lookup or a
// name the lookup does not know.
std::optional<Flag> Resolve(const Word& word, const FlagLookup& lookup);

class Reader {
 public:
  explicit Reader(std::vector<std::string> words);

  // The next word; nullopt after the last. "--" itself is not returned.
  std::optional<Word> Next();

  // The text `flag` is set from: "true" for --flag, "false" for --noflag,
  // VALUE for --flag=VALUE, and for a value flag written without '=' the
  // next word, which Next then skips. InvalidArgument "--noNAME takes no
  // value" for --noNAME=VALUE and "--NAME needs a value" when no word is left.
  absl::StatusOr<std::string> Value(const Flag& flag);

  // Passes over the value of a flag that is not the caller's to set (another
  // program's, applied there): the next word for a value flag written without
  // '=', nothing otherwise, and no error when no word is left.
  void SkipValue(const Flag& flag);

 private:
  std::vector<std::string> words_;
  std::size_t next_ = 0;
  bool only_positional_ = false;
};

}  // namespace logitd::argv
