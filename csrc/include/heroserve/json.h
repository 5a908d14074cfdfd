// Minimal JSON value, parser and writer for policy tables and test vectors.
//
// Numbers keep their source text so 64-bit integers (table versions, sequence numbers) are
// read exactly; doubles are parsed with std::from_chars (correctly rounded, locale-free) and
// written with std::to_chars (shortest round-trip form), matching Python's json module.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace heroserve::json {

enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

class Value {
 public:
  Value() = default;
  static Value Bool(bool b);
  static Value Number(double d);
  static Value Uint(uint64_t u);
  static Value String(std::string s);
  static Value Array();
  static Value Object();

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  bool as_bool() const { return bool_; }
  double as_double() const { return num_; }
  // True and sets *out when the number is a non-negative integer written without a fraction
  // or exponent that fits in 64 bits.
  bool as_uint64(uint64_t* out) const;
  const std::string& as_string() const { return str_; }
  const std::vector<Value>& items() const { return arr_; }
  const std::vector<std::pair<std::string, Value>>& members() const { return obj_; }

  // Object member lookup (first match); nullptr when absent or not an object.
  const Value* find(std::string_view key) const;

  void push_back(Value v) { arr_.push_back(std::move(v)); }
  void set(std::string key, Value v) { obj_.emplace_back(std::move(key), std::move(v)); }

 private:
  friend class Parser;
  Type type_ = Type::kNull;
  bool bool_ = false;
  double num_ = 0.0;
  std::string str_;  // string value, or a number's source text
  std::vector<Value> arr_;
  std::vector<std::pair<std::string, Value>> obj_;
};

// Parses a complete JSON document. On failure returns false and sets *error to a message
// with the byte offset. Nesting deeper than 64 levels is rejected.
bool Parse(std::string_view text, Value* out, std::string* error);

// Compact JSON text.
std::string Write(const Value& v);

}  // namespace heroserve::json
