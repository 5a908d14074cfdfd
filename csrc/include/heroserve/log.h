// The log format every HeroServe process writes, the same as the
// Python side's agents/logs.py:
//
//   text: 2026-11-23T05:12:00.123Z INFO heroserve.gpu-agent registered node=srv-p0 epoch=3
//   json: {"ts": "2026-11-23T05:12:00.123Z", "level": "INFO", "logger": "heroserve.gpu-agent",
//          "msg": "registered", "node": "srv-p0", "epoch": 3}
//
// UTC with milliseconds and Z; Python's level names; in text, a field value that is empty or
// holds a space, '=', '"' or a newline is written as a JSON string; JSON as Python's
// json.dumps writes it (", " and ": " separators, non-ASCII as \uXXXX), so a line parses
// the same whichever side wrote it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace heroserve::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
enum class Format { kText, kJson };

// One key=value of a record; `number` writes the value bare in JSON (it must be a JSON
// number), otherwise as a string.
struct Field {
  std::string key;
  std::string value;
  bool number = false;
};
Field Num(std::string key, uint64_t value);
Field Str(std::string key, std::string value);

const char* LevelName(Level level);
// "DEBUG", "INFO", "WARNING", "ERROR" in any case (Python's --log-level does str.upper).
bool ParseLevel(std::string_view name, Level* out);
// "text" or "json".
bool ParseFormat(std::string_view name, Format* out);

// Process-wide settings (main() sets them from --log-level / --log-format). Until then the
// format comes from HEROSERVE_LOG_FORMAT (text when unset or unknown) and the level is INFO.
void Configure(Level min_level, Format format);

// "2026-11-23T05:12:00.123Z" for milliseconds since the Unix epoch.
std::string UtcTimestamp(int64_t unix_ms);
// A JSON string literal for s, as Python's json.dumps writes it (invalid UTF-8 -> U+FFFD).
std::string JsonString(std::string_view s);
// One record as one line, without the newline.
std::string FormatRecord(Format format, int64_t unix_ms, Level level, std::string_view logger,
                         std::string_view msg, const std::vector<Field>& fields);
// Writes one record to stderr (whole lines, also from several threads) when at or above the
// configured level.
void Write(Level level, std::string_view logger, std::string_view msg,
           const std::vector<Field>& fields = {});

}  // namespace heroserve::log
