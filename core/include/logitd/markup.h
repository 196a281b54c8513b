// Text as XML and HTML carry it: what a report page, a JUnit file or the
// history's pages write of a name someone chose.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace logitd {

// `text` with &, <, >, " and ' as entities (&apos; is HTML5's too), and the
// control characters XML 1.0 cannot carry (below 0x20 but tab, newline and
// carriage return) as '?'.
std::string XmlEscape(absl::string_view text);

}  // namespace logitd
