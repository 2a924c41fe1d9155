// The markup checker of the renderer tests (xml_check.h).
#include "xml_check.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <vector>

namespace vramscope::testing {
namespace {

bool IsNameStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
}
bool IsNameChar(char c) {
  return IsNameStart(c) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.';
}
bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

class Checker {
 public:
  Checker(std::string_view text, bool html) : text_(text), html_(html) {}

  std::string Run() {
    while (pos_ < text_.size() && error_.empty()) {
      const char c = text_[pos_];
      if (c == '<') {
        Markup();
      } else if (c == '&') {
        Entity();
      } else {
        if (stack_.empty() && !IsSpace(c)) Fail("text outside the root element");
        ++pos_;
      }
    }
    if (error_.empty() && !stack_.empty()) Fail("unclosed <" + stack_.back() + ">");
    if (error_.empty() && roots_ != 1)
      Fail("expected one root element, found " + std::to_string(roots_));
    return error_;
  }

 private:
  void Fail(const std::string& what) {
    if (error_.empty()) error_ = "offset " + std::to_string(pos_) + ": " + what;
  }
  bool StartsWith(std::string_view s) const { return text_.substr(pos_, s.size()) == s; }
  void SkipPast(std::string_view end, const char* what) {
    const size_t at = text_.find(end, pos_);
    if (at == std::string_view::npos) return Fail(std::string("unterminated ") + what);
    pos_ = at + end.size();
  }
  std::string Name() {
    const size_t start = pos_;
    if (pos_ >= text_.size() || !IsNameStart(text_[pos_])) return "";
    while (pos_ < text_.size() && IsNameChar(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }
  void SkipSpace() {
    while (pos_ < text_.size() && IsSpace(text_[pos_])) ++pos_;
  }

  void Entity() {
    const size_t end = text_.find(';', pos_);
    if (end == std::string_view::npos || end - pos_ > 10) return Fail("bare '&'");
    const std::string_view name = text_.substr(pos_ + 1, end - pos_ - 1);
    static const std::set<std::string_view> kNamed = {"amp", "lt", "gt", "quot", "apos"};
    bool ok = kNamed.count(name) > 0;
    if (!ok && name.size() > 1 && name[0] == '#') {
      const bool hex = name[1] == 'x';
      const std::string_view digits = name.substr(hex ? 2 : 1);
      ok = !digits.empty() && std::all_of(digits.begin(), digits.end(), [&](char d) {
        return hex ? std::isxdigit(static_cast<unsigned char>(d))
                   : std::isdigit(static_cast<unsigned char>(d));
      });
    }
    if (!ok) return Fail("unknown entity &" + std::string(name) + ";");
    pos_ = end + 1;
  }

  void Markup() {
    if (StartsWith("<!--")) return SkipPast("-->", "comment");
    if (StartsWith("<?")) return SkipPast("?>", "processing instruction");
    if (StartsWith("<!")) {
      if (!html_ || Lower(text_.substr(pos_, 9)) != "<!doctype") return Fail("unexpected <!");
      return SkipPast(">", "doctype");
    }
    if (StartsWith("</")) return EndTag();
    StartTag();
  }

  void EndTag() {
    pos_ += 2;
    const std::string name = Name();
    SkipSpace();
    if (pos_ >= text_.size() || text_[pos_] != '>') return Fail("bad end tag </" + name);
    ++pos_;
    if (stack_.empty() || stack_.back() != name) {
      return Fail("</" + name + "> does not close " +
                  (stack_.empty() ? "anything" : "<" + stack_.back() + ">"));
    }
    stack_.pop_back();
  }

  void StartTag() {
    ++pos_;
    const std::string name = Name();
    if (name.empty()) return Fail("'<' not starting a tag");
    std::set<std::string> seen;
    while (error_.empty()) {
      const size_t before = pos_;
      SkipSpace();
      if (pos_ >= text_.size()) return Fail("unterminated <" + name);
      if (text_[pos_] == '>' || StartsWith("/>")) break;
      if (pos_ == before) return Fail("attributes of <" + name + "> need spaces between them");
      const std::string attr = Name();
      if (attr.empty()) return Fail("bad attribute in <" + name + ">");
      if (!seen.insert(attr).second) return Fail("duplicate attribute " + attr);
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == '=') {
        ++pos_;
        SkipSpace();
        AttributeValue();
      } else if (!html_) {
        return Fail("attribute " + attr + " has no value");
      }
    }
    if (!error_.empty()) return;
    const bool self_closing = StartsWith("/>");
    pos_ += self_closing ? 2 : 1;
    if (stack_.empty()) ++roots_;
    static const std::set<std::string> kVoid = {"meta", "br", "hr", "img", "input", "link", "wbr"};
    if (self_closing || (html_ && kVoid.count(Lower(name)))) return;
    if (html_ && (Lower(name) == "script" || Lower(name) == "style")) {
      // Raw text up to the matching end tag, as an HTML parser reads it.
      const std::string lower_rest = Lower(text_.substr(pos_));
      const size_t end = lower_rest.find("</" + Lower(name));
      if (end == std::string::npos) return Fail("unterminated <" + name + ">");
      pos_ += end;
    }
    stack_.push_back(name);
  }

  void AttributeValue() {
    if (pos_ >= text_.size() || (text_[pos_] != '"' && text_[pos_] != '\'')) {
      return Fail("unquoted attribute value");
    }
    const char quote = text_[pos_++];
    while (error_.empty()) {
      if (pos_ >= text_.size()) return Fail("unterminated attribute value");
      const char c = text_[pos_];
      if (c == quote) {
        ++pos_;
        return;
      }
      if (c == '<') return Fail("'<' in an attribute value");
      if (c == '&') {
        Entity();
      } else {
        ++pos_;
      }
    }
  }

  std::string_view text_;
  bool html_;
  size_t pos_ = 0;
  int roots_ = 0;
  std::vector<std::string> stack_;
  std::string error_;
};

}  // namespace

std::string CheckXml(std::string_view text) { return Checker(text, false).Run(); }
std::string CheckHtml(std::string_view text) { return Checker(text, true).Run(); }

}  // namespace vramscope::testing
