// The GPU agent's INA group configuration (agent/ina_config.h): what it writes from the
// controller's InaAssignment is what the CollNet plugin's parser accepts, field for field;
// entries it cannot write are named, not written; the file is replaced atomically; and the
// plugin's reader refuses what is not a bounded regular file (a FIFO is not waited on).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "group_config.h"
#include "heroserve/v1/control.pb.h"
#include "ina_config.h"

namespace pb = heroserve::v1;
using heroserve::agent::InaConfigOptions;
using heroserve::agent::InaConfigWriter;
using heroserve::agent::InaEndpoint;
using heroserve::agent::ParseInaEndpoint;
namespace ina = heroserve::ina;

namespace {

std::string TempPath(const char* name) {
  return std::string(::testing::TempDir()) + "/" + name + "." + std::to_string(::getpid());
}

// Group 9 "decode/0/0/rail1" on switch s2, slots [16, 24), three members; this server holds
// the second and third.
pb::InaAssignment Rail() {
  pb::InaAssignment a;
  a.set_group_id(9);
  a.set_group_name("decode/0/0/rail1");
  a.set_switch_("s2");
  a.mutable_slots()->set_start(16);
  a.mutable_slots()->set_count(8);
  a.set_worker_count(3);
  for (int w = 0; w < 3; w++) {
    auto* m = a.add_members();
    m->set_worker_id(static_cast<uint32_t>(w));
    m->set_gpu("srv" + std::to_string(w) + "-gpu1");
  }
  a.set_multicast_group_id(9);
  a.set_session(42);
  a.set_first_generation(0xFFFFFFF0u);
  a.set_lane_format("int32");
  return a;
}

InaConfigOptions Opts(const std::string& path) {
  InaConfigOptions o;
  o.path = path;
  EXPECT_TRUE(ParseInaEndpoint("10.0.255.2:4000", 48879, &o.switches["s2"]));
  EXPECT_TRUE(ParseInaEndpoint("10.0.1.5", 48879, &o.bind));
  return o;
}

std::string Read(const std::string& path) {
  std::string text, err;
  EXPECT_TRUE(ina::ReadConfigFile(path, &text, &err)) << err;
  return text;
}

}  // namespace

TEST(InaConfig, EndpointSyntax) {
  InaEndpoint e;
  ASSERT_TRUE(ParseInaEndpoint("10.1.2.3", 48879, &e));
  EXPECT_EQ(e.ip, inet_addr("10.1.2.3"));
  EXPECT_EQ(e.port, 48879);
  ASSERT_TRUE(ParseInaEndpoint("10.1.2.3:7", 48879, &e));
  EXPECT_EQ(e.port, 7);
  for (const char* bad : {"", "10.1.2", "10.1.2.3:", "10.1.2.3:0", "10.1.2.3:65536",
                          "10.1.2.3:-1", "10.1.2.3:1x", "host:80", "10.1.2.3:123456"}) {
    EXPECT_FALSE(ParseInaEndpoint(bad, 48879, &e)) << bad;
  }
}

TEST(InaConfig, WrittenEntriesAreWhatThePluginAccepts) {
  std::string path = TempPath("ina-written.json");
  InaConfigWriter w(Opts(path), {"srv1-gpu1", "srv2-gpu1", "srv1-gpu0"});
  pb::GpuPolicy gp;
  *gp.add_ina() = Rail();
  std::vector<std::string> errors;
  w.Apply(gp, true, &errors);
  ASSERT_TRUE(errors.empty()) << errors[0];
  std::vector<ina::GroupEntry> got;
  std::string err;
  ASSERT_TRUE(ina::ParseGroupConfig(Read(path), &got, &err)) << err;
  ASSERT_EQ(got.size(), 2u);  // srv1-gpu1 and srv2-gpu1: workers 1 and 2, in member order
  for (size_t k = 0; k < 2; k++) {
    const ina::GroupPolicy& p = got[k].policy;
    EXPECT_EQ(p.spec.group_id, 9);
    EXPECT_EQ(p.spec.worker_id, k + 1);
    EXPECT_EQ(p.spec.num_workers, 3);
    EXPECT_EQ(p.spec.window, 8u);  // the group's slot count: aggregator indices 0..7
    EXPECT_EQ(p.spec.switch_ip, inet_addr("10.0.255.2"));
    EXPECT_EQ(p.spec.switch_port, 4000);
    EXPECT_EQ(p.spec.session, 42u);
    EXPECT_EQ(p.spec.first_generation, 0xFFFFFFF0u);
    EXPECT_STREQ(p.spec.lanes.name, "int32");
    EXPECT_EQ(p.bind_ip, inet_addr("10.0.1.5"));
    EXPECT_EQ(p.bind_port, 48879);
    EXPECT_FALSE(got[k].has_comm_id);
  }
  // A delta removing the group leaves an empty list (no stale entry for the next claim).
  pb::GpuPolicy removal;
  removal.add_removed_ina_group_ids(9);
  w.Apply(removal, false, &errors);
  ASSERT_TRUE(errors.empty());
  ASSERT_TRUE(ina::ParseGroupConfig(Read(path), &got, &err)) << err;
  EXPECT_TRUE(got.empty());
  ::unlink(path.c_str());
}

TEST(InaConfig, ABfp16GroupIsWrittenAsFloatSums) {
  // The plugin refuses bfp16 without float_sums: the agent must opt the group in, or the
  // controller's bfp16 plan would reach no plugin.
  std::string path = TempPath("ina-bfp16.json");
  InaConfigWriter w(Opts(path), {"srv1-gpu1"});
  pb::GpuPolicy gp;
  pb::InaAssignment a = Rail();
  a.set_lane_format("bfp16");
  *gp.add_ina() = a;
  std::vector<std::string> errors;
  w.Apply(gp, true, &errors);
  ASSERT_TRUE(errors.empty()) << errors[0];
  std::vector<ina::GroupEntry> got;
  std::string err;
  ASSERT_TRUE(ina::ParseGroupConfig(Read(path), &got, &err)) << err;
  ASSERT_EQ(got.size(), 1u);
  EXPECT_STREQ(got[0].policy.spec.lanes.name, "bfp16");
  EXPECT_TRUE(got[0].policy.float_sums);
  ::unlink(path.c_str());
}

TEST(InaConfig, WhatCannotBeWrittenIsNamedAndLeftOut) {
  std::string path = TempPath("ina-refused.json");
  InaConfigWriter w(Opts(path), {"srv1-gpu1"});
  pb::GpuPolicy gp;
  pb::InaAssignment no_switch = Rail();
  no_switch.set_group_id(10);
  no_switch.set_switch_("s7");  // no --ina-switch for it
  pb::InaAssignment too_wide = Rail();
  too_wide.set_group_id(11);
  too_wide.mutable_slots()->set_count(65536);  // past the 16-bit aggregator index
  pb::InaAssignment wrong_lanes = Rail();
  wrong_lanes.set_group_id(12);
  wrong_lanes.set_lane_format("int64");
  *gp.add_ina() = Rail();
  *gp.add_ina() = no_switch;
  *gp.add_ina() = too_wide;
  *gp.add_ina() = wrong_lanes;
  std::vector<std::string> errors;
  w.Apply(gp, true, &errors);
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_NE(errors[0].find("no address for switch s7"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("window"), std::string::npos) << errors[1];
  EXPECT_NE(errors[2].find("lane_format"), std::string::npos) << errors[2];
  std::vector<ina::GroupEntry> got;
  std::string err;
  ASSERT_TRUE(ina::ParseGroupConfig(Read(path), &got, &err)) << err;
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].policy.spec.group_id, 9);
  ::unlink(path.c_str());
}

TEST(InaConfig, ReplacedByRenameNoTemporaryLeft) {
  std::string path = TempPath("ina-atomic.json");
  { std::ofstream(path) << "old"; }
  struct stat before{};
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  std::string err;
  ASSERT_TRUE(heroserve::agent::WriteFileAtomically(path, "{\"groups\": []}", &err)) << err;
  struct stat after{};
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_NE(before.st_ino, after.st_ino);  // a new file renamed over the old one
  EXPECT_EQ(Read(path), "{\"groups\": []}");
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  EXPECT_NE(::access(tmp.c_str(), F_OK), 0);
  ::unlink(path.c_str());
}

TEST(InaConfig, ReaderRefusesFifoAndOversizedFiles) {
  std::string fifo = TempPath("ina-fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string text, err;
  EXPECT_FALSE(ina::ReadConfigFile(fifo, &text, &err));  // returns: never waits for a writer
  EXPECT_EQ(err, "not a regular file");
  ::unlink(fifo.c_str());
  std::string big = TempPath("ina-big.json");
  { std::ofstream(big) << std::string(ina::kMaxConfigBytes + 1, ' '); }
  EXPECT_FALSE(ina::ReadConfigFile(big, &text, &err));
  EXPECT_NE(err.find("larger than"), std::string::npos) << err;
  ::unlink(big.c_str());
  EXPECT_FALSE(ina::ReadConfigFile(TempPath("ina-absent"), &text, &err));
}
