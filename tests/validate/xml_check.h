// A small XML well-formedness check for the harness's reports (JUnit XML,
// the HTML report written as XHTML), so the tests need no XML library.
#pragma once

#include <cctype>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace logitd::testing {

// A small well-formedness check: one root, balanced tags, quoted attributes,
// no raw '<' or stray '&' in text or attribute values.
inline std::string XmlProblem(const std::string& x) {
  std::size_t i = 0;
  if (x.rfind("<?xml", 0) == 0) i = x.find("?>") + 2;
  std::vector<std::string> open;
  int roots = 0;
  auto bad_entities = [](const std::string& text) {
    for (std::size_t p = text.find('&'); p != std::string::npos; p = text.find('&', p + 1)) {
      const std::size_t semi = text.find(';', p);
      if (semi == std::string::npos) return true;
      const std::string e = text.substr(p, semi - p + 1);
      if (e != "&amp;" && e != "&lt;" && e != "&gt;" && e != "&quot;" && e != "&apos;") return true;
    }
    return false;
  };
  while (i < x.size()) {
    const std::size_t lt = x.find('<', i);
    const std::string text = x.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
    if (bad_entities(text)) return "bad entity in text";
    if (open.empty() && text.find_first_not_of(" \t\r\n") != std::string::npos) {
      return "text outside the root";
    }
    if (lt == std::string::npos) break;
    const std::size_t gt = x.find('>', lt);
    if (gt == std::string::npos) return "unterminated tag";
    std::string tag = x.substr(lt + 1, gt - lt - 1);
    i = gt + 1;
    if (tag.rfind("!--", 0) == 0) continue;
    if (!tag.empty() && tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1))
        return "mismatched </" + tag.substr(1) + ">";
      open.pop_back();
      continue;
    }
    const bool self_closing = !tag.empty() && tag.back() == '/';
    if (self_closing) tag.pop_back();
    std::size_t p = 0;
    while (p < tag.size() && !std::isspace(static_cast<unsigned char>(tag[p]))) ++p;
    const std::string name = tag.substr(0, p);
    if (name.empty()) return "empty tag name";
    // Attributes: name="value" pairs.
    while (p < tag.size()) {
      while (p < tag.size() && std::isspace(static_cast<unsigned char>(tag[p]))) ++p;
      if (p >= tag.size()) break;
      const std::size_t eq = tag.find('=', p);
      if (eq == std::string::npos || eq + 1 >= tag.size() || tag[eq + 1] != '"') {
        return "unquoted attribute in <" + name + ">";
      }
      const std::size_t close = tag.find('"', eq + 2);
      if (close == std::string::npos) return "unterminated attribute in <" + name + ">";
      const std::string value = tag.substr(eq + 2, close - eq - 2);
      if (value.find('<') != std::string::npos || bad_entities(value)) {
        return "bad attribute value in <" + name + ">";
      }
      p = close + 1;
    }
    if (open.empty()) ++roots;
    if (!self_closing) open.push_back(name);
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  if (roots != 1) return absl::StrCat(roots, " root elements");
  return "";
}

}  // namespace logitd::testing
