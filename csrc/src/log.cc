#include "heroserve/log.h"

#include <time.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace heroserve::log {

namespace {

std::atomic<int> g_min_level{static_cast<int>(Level::kInfo)};
std::atomic<int> g_format{-1};  // -1: not configured, look at HEROSERVE_LOG_FORMAT
std::mutex g_write_mu;

Format CurrentFormat() {
  int f = g_format.load(std::memory_order_relaxed);
  if (f < 0) {
    Format env = Format::kText;
    const char* v = std::getenv("HEROSERVE_LOG_FORMAT");
    if (v) ParseFormat(v, &env);
    f = static_cast<int>(env);
    g_format.store(f, std::memory_order_relaxed);
  }
  return static_cast<Format>(f);
}

void AppendHex4(std::string* out, uint32_t u) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\u%04x", u & 0xFFFFu);
  out->append(buf);
}

// Decodes one UTF-8 sequence at s[*i] and moves past it; an invalid or truncated one
// gives U+FFFD and consumes one byte.
uint32_t NextCodePoint(std::string_view s, size_t* i) {
  auto b = static_cast<unsigned char>(s[*i]);
  if (b < 0x80) {
    ++*i;
    return b;
  }
  size_t n = (b >> 5) == 0x6 ? 1 : (b >> 4) == 0xE ? 2 : (b >> 3) == 0x1E ? 3 : 0;
  if (n == 0 || *i + n >= s.size()) {
    ++*i;
    return 0xFFFD;
  }
  uint32_t cp = b & (0x3Fu >> n);
  for (size_t k = 1; k <= n; ++k) {
    auto c = static_cast<unsigned char>(s[*i + k]);
    if ((c >> 6) != 0x2) {
      ++*i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (c & 0x3Fu);
  }
  static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++*i;
    return 0xFFFD;
  }
  *i += n + 1;
  return cp;
}

// Python's text rule: quote an empty value or one a space-splitting reader would misread.
bool NeedsQuotes(std::string_view v) {
  return v.empty() || v.find_first_of(" =\"\n") != std::string_view::npos;
}

}  // namespace

Field Num(std::string key, uint64_t value) {
  return Field{std::move(key), std::to_string(value), true};
}

Field Str(std::string key, std::string value) {
  return Field{std::move(key), std::move(value), false};
}

const char* LevelName(Level level) {
  switch (level) {
    case Level::kDebug: return "DEBUG";
    case Level::kInfo: return "INFO";
    case Level::kWarning: return "WARNING";
    case Level::kError: return "ERROR";
  }
  return "INFO";
}

bool ParseLevel(std::string_view name, Level* out) {
  std::string up(name);
  for (char& c : up) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  for (Level l : {Level::kDebug, Level::kInfo, Level::kWarning, Level::kError}) {
    if (up == LevelName(l)) {
      *out = l;
      return true;
    }
  }
  return false;
}

bool ParseFormat(std::string_view name, Format* out) {
  if (name == "text") {
    *out = Format::kText;
  } else if (name == "json") {
    *out = Format::kJson;
  } else {
    return false;
  }
  return true;
}

void Configure(Level min_level, Format format) {
  g_min_level.store(static_cast<int>(min_level), std::memory_order_relaxed);
  g_format.store(static_cast<int>(format), std::memory_order_relaxed);
}

std::string UtcTimestamp(int64_t unix_ms) {
  time_t secs = static_cast<time_t>(unix_ms / 1000);
  int ms = static_cast<int>(unix_ms % 1000);
  if (ms < 0) {
    ms += 1000;
    --secs;
  }
  struct tm tm {};
  gmtime_r(&secs, &tm);
  char buf[40];
  size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", ms);
  return buf;
}

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = NextCodePoint(s, &i);
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp >= 0x20 && cp < 0x7F) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x10000) {
      AppendHex4(&out, cp);
    } else {  // a surrogate pair, as json.dumps writes astral characters
      uint32_t v = cp - 0x10000;
      AppendHex4(&out, 0xD800 | (v >> 10));
      AppendHex4(&out, 0xDC00 | (v & 0x3FF));
    }
  }
  out.push_back('"');
  return out;
}

std::string FormatRecord(Format format, int64_t unix_ms, Level level, std::string_view logger,
                         std::string_view msg, const std::vector<Field>& fields) {
  std::string ts = UtcTimestamp(unix_ms);
  std::string line;
  if (format == Format::kText) {
    line = ts + " " + LevelName(level) + " " + std::string(logger) + " " + std::string(msg);
    for (const auto& f : fields) {
      line += " " + f.key + "=" + (NeedsQuotes(f.value) ? JsonString(f.value) : f.value);
    }
    return line;
  }
  line = "{\"ts\": " + JsonString(ts) + ", \"level\": " + JsonString(LevelName(level)) +
         ", \"logger\": " + JsonString(logger) + ", \"msg\": " + JsonString(msg);
  for (const auto& f : fields) {
    if (f.key == "ts" || f.key == "level" || f.key == "logger" || f.key == "msg") {
      continue;  // the record's own keys win, as in agents/logs.py
    }
    line += ", " + JsonString(f.key) + ": " + (f.number ? f.value : JsonString(f.value));
  }
  line += "}";
  return line;
}

void Write(Level level, std::string_view logger, std::string_view msg,
           const std::vector<Field>& fields) {
  if (static_cast<int>(level) < g_min_level.load(std::memory_order_relaxed)) return;
  struct timespec now {};
  clock_gettime(CLOCK_REALTIME, &now);
  int64_t ms = static_cast<int64_t>(now.tv_sec) * 1000 + now.tv_nsec / 1000000;
  std::string line = FormatRecord(CurrentFormat(), ms, level, logger, msg, fields);
  line.push_back('\n');
  std::lock_guard<std::mutex> lock(g_write_mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace heroserve::log
