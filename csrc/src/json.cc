#include "heroserve/json.h"

#include <charconv>
#include <cmath>
#include <system_error>

namespace heroserve::json {

Value Value::Bool(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}

Value Value::Number(double d) {
  Value v;
  v.type_ = Type::kNumber;
  v.num_ = d;
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  v.str_.assign(buf, r.ptr);
  return v;
}

Value Value::Uint(uint64_t u) {
  Value v;
  v.type_ = Type::kNumber;
  v.num_ = static_cast<double>(u);
  v.str_ = std::to_string(u);
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.type_ = Type::kString;
  v.str_ = std::move(s);
  return v;
}

Value Value::Array() {
  Value v;
  v.type_ = Type::kArray;
  return v;
}

Value Value::Object() {
  Value v;
  v.type_ = Type::kObject;
  return v;
}

bool Value::as_uint64(uint64_t* out) const {
  if (type_ != Type::kNumber || str_.empty()) return false;
  for (char c : str_) {
    if (c < '0' || c > '9') return false;
  }
  uint64_t u = 0;
  auto r = std::from_chars(str_.data(), str_.data() + str_.size(), u);
  if (r.ec != std::errc() || r.ptr != str_.data() + str_.size()) return false;
  *out = u;
  return true;
}

const Value* Value::find(std::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& kv : obj_) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

class Parser {
 public:
  explicit Parser(std::string_view t) : t_(t) {}

  bool Document(Value* out, std::string* error) {
    SkipWs();
    if (!ParseValue(out, 0)) {
      *error = err_ + " at byte " + std::to_string(pos_);
      return false;
    }
    SkipWs();
    if (pos_ != t_.size()) {
      *error = "trailing characters at byte " + std::to_string(pos_);
      return false;
    }
    return true;
  }

 private:
  bool Fail(const char* msg) {
    if (err_.empty()) err_ = msg;
    return false;
  }

  void SkipWs() {
    while (pos_ < t_.size() &&
           (t_[pos_] == ' ' || t_[pos_] == '\n' || t_[pos_] == '\r' || t_[pos_] == '\t')) {
      ++pos_;
    }
  }

  bool Literal(std::string_view word) {
    if (t_.substr(pos_, word.size()) != word) return Fail("invalid literal");
    pos_ += word.size();
    return true;
  }

  bool ParseValue(Value* v, int depth) {
    if (depth > 64) return Fail("nesting too deep");
    if (pos_ >= t_.size()) return Fail("unexpected end of input");
    char c = t_[pos_];
    if (c == '{') return ParseObject(v, depth);
    if (c == '[') return ParseArray(v, depth);
    if (c == '"') {
      v->type_ = Type::kString;
      return ParseString(&v->str_);
    }
    if (c == 't') {
      *v = Value::Bool(true);
      return Literal("true");
    }
    if (c == 'f') {
      *v = Value::Bool(false);
      return Literal("false");
    }
    if (c == 'n') {
      *v = Value();
      return Literal("null");
    }
    return ParseNumber(v);
  }

  bool ParseNumber(Value* v) {
    size_t start = pos_;
    if (pos_ < t_.size() && t_[pos_] == '-') ++pos_;
    size_t digits = pos_;
    while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') ++pos_;
    if (pos_ == digits) return Fail("invalid number");
    if (pos_ < t_.size() && t_[pos_] == '.') {
      ++pos_;
      size_t frac = pos_;
      while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') ++pos_;
      if (pos_ == frac) return Fail("invalid number");
    }
    if (pos_ < t_.size() && (t_[pos_] == 'e' || t_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < t_.size() && (t_[pos_] == '+' || t_[pos_] == '-')) ++pos_;
      size_t ex = pos_;
      while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') ++pos_;
      if (pos_ == ex) return Fail("invalid number");
    }
    double d = 0.0;
    auto r = std::from_chars(t_.data() + start, t_.data() + pos_, d);
    if (r.ec != std::errc() || !std::isfinite(d)) return Fail("number out of range");
    v->type_ = Type::kNumber;
    v->num_ = d;
    v->str_.assign(t_.data() + start, pos_ - start);
    return true;
  }

  static void AppendUtf8(std::string* s, uint32_t cp) {
    if (cp < 0x80) {
      s->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      s->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      s->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      s->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  bool Hex4(uint32_t* out) {
    if (pos_ + 4 > t_.size()) return Fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = t_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return Fail("invalid \\u escape");
      }
    }
    *out = v;
    return true;
  }

  bool ParseString(std::string* s) {
    ++pos_;  // opening quote
    s->clear();
    while (true) {
      if (pos_ >= t_.size()) return Fail("unterminated string");
      char c = t_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return Fail("control character in string");
      if (c != '\\') {
        s->push_back(c);
        continue;
      }
      if (pos_ >= t_.size()) return Fail("unterminated escape");
      char e = t_[pos_++];
      switch (e) {
        case '"': s->push_back('"'); break;
        case '\\': s->push_back('\\'); break;
        case '/': s->push_back('/'); break;
        case 'b': s->push_back('\b'); break;
        case 'f': s->push_back('\f'); break;
        case 'n': s->push_back('\n'); break;
        case 'r': s->push_back('\r'); break;
        case 't': s->push_back('\t'); break;
        case 'u': {
          uint32_t cp = 0;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && t_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            uint32_t lo = 0;
            if (!Hex4(&lo)) return false;
            if (lo < 0xDC00 || lo >= 0xE000) return Fail("invalid surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          AppendUtf8(s, cp);
          break;
        }
        default:
          return Fail("invalid escape");
      }
    }
  }

  bool ParseArray(Value* v, int depth) {
    ++pos_;
    *v = Value::Array();
    SkipWs();
    if (pos_ < t_.size() && t_[pos_] == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      SkipWs();
      Value item;
      if (!ParseValue(&item, depth + 1)) return false;
      v->arr_.push_back(std::move(item));
      SkipWs();
      if (pos_ >= t_.size()) return Fail("unterminated array");
      char c = t_[pos_++];
      if (c == ']') return true;
      if (c != ',') return Fail("expected ',' or ']'");
    }
  }

  bool ParseObject(Value* v, int depth) {
    ++pos_;
    *v = Value::Object();
    SkipWs();
    if (pos_ < t_.size() && t_[pos_] == '}') {
      ++pos_;
      return true;
    }
    while (true) {
      SkipWs();
      if (pos_ >= t_.size() || t_[pos_] != '"') return Fail("expected a member name");
      std::string key;
      if (!ParseString(&key)) return false;
      SkipWs();
      if (pos_ >= t_.size() || t_[pos_++] != ':') return Fail("expected ':'");
      SkipWs();
      Value item;
      if (!ParseValue(&item, depth + 1)) return false;
      v->obj_.emplace_back(std::move(key), std::move(item));
      SkipWs();
      if (pos_ >= t_.size()) return Fail("unterminated object");
      char c = t_[pos_++];
      if (c == '}') return true;
      if (c != ',') return Fail("expected ',' or '}'");
    }
  }

  std::string_view t_;
  size_t pos_ = 0;
  std::string err_;
};

bool Parse(std::string_view text, Value* out, std::string* error) {
  Parser p(text);
  return p.Document(out, error);
}

namespace {

void WriteString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          static const char* hex = "0123456789abcdef";
          buf[0] = '\\';
          buf[1] = 'u';
          buf[2] = '0';
          buf[3] = '0';
          buf[4] = hex[c >> 4];
          buf[5] = hex[c & 15];
          out->append(buf, 6);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void WriteValue(const Value& v, std::string* out) {
  switch (v.type()) {
    case Type::kNull: *out += "null"; break;
    case Type::kBool: *out += v.as_bool() ? "true" : "false"; break;
    case Type::kNumber: *out += v.as_string(); break;
    case Type::kString: WriteString(v.as_string(), out); break;
    case Type::kArray: {
      out->push_back('[');
      bool first = true;
      for (const auto& item : v.items()) {
        if (!first) out->push_back(',');
        first = false;
        WriteValue(item, out);
      }
      out->push_back(']');
      break;
    }
    case Type::kObject: {
      out->push_back('{');
      bool first = true;
      for (const auto& kv : v.members()) {
        if (!first) out->push_back(',');
        first = false;
        WriteString(kv.first, out);
        out->push_back(':');
        WriteValue(kv.second, out);
      }
      out->push_back('}');
      break;
    }
  }
}

}  // namespace

std::string Write(const Value& v) {
  std::string out;
  WriteValue(v, &out);
  return out;
}

}  // namespace heroserve::json
