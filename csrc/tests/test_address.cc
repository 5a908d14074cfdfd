// The GPU agent's controller address and loopback rule (the agent took
// `127.evil.example:5` for loopback and skipped TLS).
#include <gtest/gtest.h>

#include "address.h"

namespace heroserve::agent {
namespace {

TEST(Address, OnlyLoopbackLiteralsAndLocalhostAreLoopback) {
  for (const char* h : {"127.0.0.1", "127.255.0.9", "::1", "0:0:0:0:0:0:0:1", "localhost",
                        "LocalHost", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
  }
  for (const char* h : {"127.evil.example", "127.0.0.1.evil.example", "127.1", "127", "10.0.0.1",
                        "128.0.0.1", "localhost.evil.example", "evil-localhost", "::2",
                        "::ffff:10.0.0.1", "0.0.0.0", "::", "", "127.0.0.1 ", "unix:/tmp/s"}) {
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
}

TEST(Address, ParsesHostAndPort) {
  HostPort hp;
  std::string err;
  ASSERT_TRUE(ParseHostPort("127.evil.example:5", &hp, &err)) << err;
  EXPECT_EQ(hp.host, "127.evil.example");
  EXPECT_EQ(hp.port, 5);
  EXPECT_FALSE(IsLoopbackHost(hp.host));
  ASSERT_TRUE(ParseHostPort("[::1]:50051", &hp, &err)) << err;
  EXPECT_EQ(hp.host, "::1");
  EXPECT_EQ(hp.port, 50051);
  EXPECT_TRUE(IsLoopbackHost(hp.host));
  ASSERT_TRUE(ParseHostPort("localhost:65535", &hp, &err)) << err;
  EXPECT_EQ(hp.port, 65535);
}

TEST(Address, RefusesMalformedAddressesWithAReason) {
  struct Case {
    const char* address;
    const char* word;
  } cases[] = {
      {"127.0.0.1", "no :PORT"},       {"127.0.0.1:", "port"},
      {"127.0.0.1:0", "port"},         {"127.0.0.1:65536", "port"},
      {"127.0.0.1:99999", "port"},     {"127.0.0.1:5x", "port"},
      {"127.0.0.1:-5", "port"},        {":5", "no host"},
      {"::1:5", "[ADDRESS]:PORT"},     {"[::1]5", "[IPV6]:PORT"},
      {"[::1", "[IPV6]:PORT"},         {"[evil.example]:5", "not an IPv6"},
  };
  for (const auto& c : cases) {
    HostPort hp;
    std::string err;
    EXPECT_FALSE(ParseHostPort(c.address, &hp, &err)) << c.address;
    EXPECT_NE(err.find(c.word), std::string::npos) << c.address << ": " << err;
  }
}

}  // namespace
}  // namespace heroserve::agent
