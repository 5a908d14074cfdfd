#include <gtest/gtest.h>

#include "heroserve/json.h"

namespace heroserve::json {
namespace {

TEST(Json, ParsesNestedDocument) {
  Value v;
  std::string err;
  ASSERT_TRUE(Parse(R"( {"a": [1, 2.5, -3e2, true, null], "b": {"c": "x\"y\u00e9"}} )", &v, &err))
      << err;
  ASSERT_TRUE(v.is_object());
  const Value* a = v.find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items().size(), 5u);
  EXPECT_EQ(a->items()[1].as_double(), 2.5);
  EXPECT_EQ(a->items()[2].as_double(), -300.0);
  EXPECT_TRUE(a->items()[3].as_bool());
  EXPECT_TRUE(a->items()[4].is_null());
  EXPECT_EQ(v.find("b")->find("c")->as_string(), "x\"y\xc3\xa9");
}

TEST(Json, Uint64IsExact) {
  Value v;
  std::string err;
  ASSERT_TRUE(Parse("[18446744073709551615, 9007199254740993, 1.0, -1, 1e3]", &v, &err));
  uint64_t u = 0;
  ASSERT_TRUE(v.items()[0].as_uint64(&u));
  EXPECT_EQ(u, 18446744073709551615ull);
  ASSERT_TRUE(v.items()[1].as_uint64(&u));
  EXPECT_EQ(u, 9007199254740993ull);  // not representable as a double
  EXPECT_FALSE(v.items()[2].as_uint64(&u));
  EXPECT_FALSE(v.items()[3].as_uint64(&u));
  EXPECT_FALSE(v.items()[4].as_uint64(&u));
}

TEST(Json, RejectsMalformedInput) {
  Value v;
  std::string err;
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "[1] x", "\"\\q\"", "01x", "nul",
                          "[1e999]", "\"a\nb\""}) {
    EXPECT_FALSE(Parse(bad, &v, &err)) << bad;
    EXPECT_FALSE(err.empty());
  }
  std::string deep(100, '[');
  EXPECT_FALSE(Parse(deep, &v, &err));
}

TEST(Json, DoublesRoundTripShortest) {
  Value v = Value::Number(0.1 + 0.2);
  EXPECT_EQ(Write(v), "0.30000000000000004");  // what Python's repr writes
  Value back;
  std::string err;
  ASSERT_TRUE(Parse(Write(v), &back, &err));
  EXPECT_EQ(back.as_double(), 0.1 + 0.2);
}

}  // namespace
}  // namespace heroserve::json
