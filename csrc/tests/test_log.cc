// The shared log format: the lines agents/logs.py writes for the
// same record, byte for byte (its tests use the same instant and record).
#include <gtest/gtest.h>

#include "heroserve/log.h"

namespace heroserve::log {
namespace {

constexpr int64_t kInstantMs = 1795410720123;  // 2026-11-23T05:12:00.123Z

TEST(Log, TimestampIsUtcWithMillisecondsAndZ) {
  EXPECT_EQ(UtcTimestamp(kInstantMs), "2026-11-23T05:12:00.123Z");
  EXPECT_EQ(UtcTimestamp(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(UtcTimestamp(999), "1970-01-01T00:00:00.999Z");
}

TEST(Log, TextLineHasTheSharedFieldsInOrder) {
  EXPECT_EQ(FormatRecord(Format::kText, kInstantMs, Level::kInfo, "heroserve.controller",
                         "plan applied", {Num("epoch", 3), Str("plan", "a b")}),
            "2026-11-23T05:12:00.123Z INFO heroserve.controller plan applied epoch=3 "
            "plan=\"a b\"");
  // Values a space-splitting reader would misread are JSON strings; others stay bare.
  EXPECT_EQ(FormatRecord(Format::kText, 0, Level::kWarning, "heroserve.tuner", "m",
                         {Str("a", ""), Str("b", "x=y"), Str("c", "q\""), Str("d", "decode/0/1")}),
            "1970-01-01T00:00:00.000Z WARNING heroserve.tuner m a=\"\" b=\"x=y\" c=\"q\\\"\" "
            "d=decode/0/1");
}

TEST(Log, JsonLineIsWhatPythonsJsonDumpsWrites) {
  EXPECT_EQ(FormatRecord(Format::kJson, kInstantMs, Level::kInfo, "heroserve.controller",
                         "plan applied", {Num("epoch", 3)}),
            "{\"ts\": \"2026-11-23T05:12:00.123Z\", \"level\": \"INFO\", \"logger\": "
            "\"heroserve.controller\", \"msg\": \"plan applied\", \"epoch\": 3}");
  // A field may not replace the record's own keys.
  EXPECT_EQ(FormatRecord(Format::kJson, 0, Level::kError, "l", "m", {Str("msg", "x")}),
            "{\"ts\": \"1970-01-01T00:00:00.000Z\", \"level\": \"ERROR\", \"logger\": \"l\", "
            "\"msg\": \"m\"}");
}

TEST(Log, JsonStringEscapesLikePython) {
  EXPECT_EQ(JsonString("a\"b\\c\n\t\r\b\f"), "\"a\\\"b\\\\c\\n\\t\\r\\b\\f\"");
  EXPECT_EQ(JsonString(std::string("\x01\x7f", 2)), "\"\\u0001\\u007f\"");
  EXPECT_EQ(JsonString("caf\xc3\xa9"), "\"caf\\u00e9\"");                // U+00E9
  EXPECT_EQ(JsonString("\xf0\x9f\x98\x80"), "\"\\ud83d\\ude00\"");        // U+1F600
  EXPECT_EQ(JsonString("\xff" "a\xc3"), "\"\\ufffda\\ufffd\"");            // invalid, truncated
  EXPECT_EQ(JsonString("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");     // a lone surrogate
}

TEST(Log, LevelsAndFormatsArePythons) {
  Level l = Level::kInfo;
  ASSERT_TRUE(ParseLevel("warning", &l));
  EXPECT_EQ(l, Level::kWarning);
  ASSERT_TRUE(ParseLevel("DEBUG", &l));
  EXPECT_EQ(l, Level::kDebug);
  EXPECT_FALSE(ParseLevel("WARN", &l));  // not one of agents/logs.py's LEVELS
  EXPECT_FALSE(ParseLevel("", &l));
  Format f = Format::kText;
  ASSERT_TRUE(ParseFormat("json", &f));
  EXPECT_EQ(f, Format::kJson);
  EXPECT_FALSE(ParseFormat("xml", &f));
  EXPECT_FALSE(ParseFormat("JSON", &f));  // argparse choices are case-sensitive
}

}  // namespace
}  // namespace heroserve::log
