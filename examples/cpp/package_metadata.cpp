#include "package_metadata.h"

#include <cctype>
#include <stdexcept>

namespace redet_example {
namespace {

// Reads the JSON that Python's json.dumps writes: enough of the grammar to walk one object, read
// strings (escapes included: json.dumps writes non-ASCII class names as \uXXXX), integers and
// arrays of them, and skip every other value.
class JsonReader {
 public:
  explicit JsonReader(const std::string& text) : text_(text) {}

  void expect(char c) {
    skip_space();
    if (pos_ >= text_.size() || text_[pos_] != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }

  // True (and consumed) when the next character is c.
  bool accept(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  std::string read_string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated string");
      const char escaped = text_[pos_++];
      switch (escaped) {
        case '"': case '\\': case '/': out += escaped; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': append_utf8(read_code_point(), out); break;
        default: fail("bad escape in a string");
      }
    }
  }

  int64_t read_integer() {
    skip_space();
    const size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    if (pos_ == start || pos_ - start > 18) fail("expected an integer");
    return std::stoll(text_.substr(start, pos_ - start));
  }

  void skip_value() {
    skip_space();
    if (pos_ >= text_.size()) fail("expected a value");
    const char c = text_[pos_];
    if (c == '"') {
      read_string();
    } else if (c == '[' || c == '{') {
      const char close = c == '[' ? ']' : '}';
      ++pos_;
      if (accept(close)) return;
      do {
        if (close == '}') {
          read_string();
          expect(':');
        }
        skip_value();
      } while (accept(','));
      expect(close);
    } else {  // a number, true, false or null
      const size_t start = pos_;
      while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) ||
                                     text_[pos_] == '-' || text_[pos_] == '+' || text_[pos_] == '.')) {
        ++pos_;
      }
      if (pos_ == start) fail("unexpected character");
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("the package's \"redet\" metadata is not the JSON expected (" + what +
                             " at character " + std::to_string(pos_) + ")");
  }

 private:
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }

  uint32_t read_hex4() {
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      const char c = pos_ < text_.size() ? text_[pos_] : '\0';
      if (!std::isxdigit(static_cast<unsigned char>(c))) fail("bad \\u escape");
      value = value * 16 + (std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return value;
  }

  // One \uXXXX escape (its "\u" already read), joining a UTF-16 surrogate pair.
  uint32_t read_code_point() {
    const uint32_t first = read_hex4();
    if (first < 0xD800 || first > 0xDBFF) return first;
    if (text_.compare(pos_, 2, "\\u") != 0) fail("unpaired surrogate");
    pos_ += 2;
    const uint32_t second = read_hex4();
    return 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
  }

  static void append_utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  const std::string& text_;
  size_t pos_ = 0;
};

}  // namespace

PackageInfo parse_package_info(const std::string& json) {
  JsonReader reader(json);
  PackageInfo info;
  bool has_classes = false, has_input_size = false;
  reader.expect('{');
  if (!reader.accept('}')) {
    do {
      const std::string key = reader.read_string();
      reader.expect(':');
      if (key == "classes") {
        reader.expect('[');
        if (!reader.accept(']')) {
          do info.classes.push_back(reader.read_string()); while (reader.accept(','));
          reader.expect(']');
        }
        has_classes = true;
      } else if (key == "input_size") {
        reader.expect('[');
        info.input_height = reader.read_integer();
        reader.expect(',');
        info.input_width = reader.read_integer();
        reader.expect(']');
        if (info.input_height <= 0 || info.input_width <= 0) reader.fail("input_size not positive");
        has_input_size = true;
      } else if (key == "torch") {
        info.torch_version = reader.read_string();
      } else {
        reader.skip_value();
      }
    } while (reader.accept(','));
    reader.expect('}');
  }
  if (!has_classes || !has_input_size) {
    throw std::runtime_error(std::string("the package's \"redet\" metadata lacks \"") +
                             (has_classes ? "input_size" : "classes") +
                             "\": was it written by redet_plugin's exporter?");
  }
  return info;
}

}  // namespace redet_example
