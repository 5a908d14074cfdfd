// The tuner plugin in a forked child (a serving process that forks workers after NCCL
// init): threads do not survive fork, so the child has no reader thread, and a mutex some
// other thread of the parent held at the fork would stay held for ever in the child. The
// child must still read long tables (more than kInlineReadBytes, the reader thread's work)
// and take their decisions: after a fork with the reader idle, and after a fork while the
// reader was inside the group's feed (refusing a payload, in NCCL's logger).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <poll.h>

#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <mutex>
#include <string>
#include <thread>

#include "heroserve/shm.h"
#include "nccl_tuner_abi.h"
#include "plugin_util.h"

#if defined(__SANITIZE_THREAD__)
// The child starts the reader thread again, which ThreadSanitizer refuses by default after a
// multithreaded fork (its own runtime's state); the plugin's fork handlers are what this
// test checks.
extern "C" const char* __tsan_default_options() { return "die_after_fork=0"; }
#endif

namespace {

namespace shm = heroserve::shm;
using plugin_test::Doc;
using plugin_test::Table;

// A logger that, once armed, holds the thread logging a refusal inside NCCL's logger (the
// reader thread, holding the group's feed) until the test has forked, or at most kHoldFor:
// a plugin that waits at fork for its feed to be free gets it back then.
constexpr auto kHoldFor = std::chrono::seconds(2);
std::mutex g_gate_mu;
std::condition_variable g_gate_cv;
bool g_armed = false, g_inside = false, g_forked = false;

void GateLogger(int /*level*/, unsigned long /*flags*/, const char* /*file*/, int /*line*/,
                const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const std::string line = plugin_test::FormatLine(fmt, ap);
  va_end(ap);
  std::unique_lock<std::mutex> lock(g_gate_mu);
  if (!g_armed || line.find("refused") == std::string::npos) return;
  g_armed = false;
  g_inside = true;
  g_gate_cv.notify_all();
  g_gate_cv.wait_for(lock, kHoldFor, [] { return g_forked; });
}

class Fork : public plugin_test::PluginTest {
 protected:
  Fork() : PluginTest("fork") {}
  void* InitGated() {
    setenv("HEROSERVE_GROUP", group_.c_str(), 1);
    void* ctx = nullptr;
    EXPECT_EQ(plugin_->v6->init(&ctx, 1, 2, 1, GateLogger, nullptr, nullptr), 0);
    ctxs_.push_back(ctx);
    return ctx;
  }
  // AllReduces until the context's table version is `version`, at most 5 s.
  bool RunUntilVersion(void* ctx, uint64_t version) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      plugin_->AllReduce(ctx, 1 << 20);
      if (plugin_->Stats(ctx).table_version == version) return true;
      std::this_thread::yield();
    }
    return false;
  }
  // A valid payload naming versions 1..`version`, padded with blanks past the inline bound
  // (1 MiB): only the reader thread reads it.
  std::string Long(uint64_t version) {
    std::vector<std::string> tables;
    for (uint64_t v = 1; v <= version; ++v) tables.push_back(Table(group_, v, 0, 0.0));
    std::string d = Doc(tables);
    d.append((1 << 20) - d.size(), ' ');
    return d;
  }
  // In the child: publishes `count` long tables after `from`, one at a time, each of which
  // must come to decide; exits 0, or the 1-based number of the table that never did.
  [[noreturn]] void Child(shm::Segment& w, void* ctx, uint64_t from, int count) {
    std::string err;
    for (int i = 1; i <= count; ++i) {
      if (!w.Publish(Long(from + i), from + i, &err) || !RunUntilVersion(ctx, from + i)) _exit(i);
    }
    _exit(0);
  }
  // The child's exit status, waited for at most 20 s (a child deadlocked on a mutex held at
  // the fork is killed and reported as such).
  static std::string Reap(pid_t pid) {
    int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (fd >= 0) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 20000) == 0) kill(pid, SIGKILL);
      close(fd);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return "waitpid failed";
    if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
    if (WEXITSTATUS(status) != 0)
      return "long table " + std::to_string(WEXITSTATUS(status)) + " never decided";
    return "";
  }
};

// The reader idle at the fork (it read a long table in the parent): the child's collectives
// start one of its own, which reads the child's long tables one after another (each handed
// over through the thread's wake-up, which the parent's thread was waiting on at the fork).
TEST_F(Fork, ChildReadsLongTablesAfterAForkWithTheReaderIdle) {
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, 2 << 20, &err)) << err;
  ASSERT_TRUE(w.Publish(Doc({Table(group_, 1, 0, 0.0)}), 1, &err)) << err;
  void* ctx = Init();
  ASSERT_TRUE(w.Publish(Long(2), 2, &err)) << err;
  ASSERT_TRUE(RunUntilVersion(ctx, 2));
  ASSERT_EQ(plugin_->Stats(ctx).reader_parsed, 1u);  // the parent's reader thread read it
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) Child(w, ctx, 2, 3);
  EXPECT_EQ(Reap(pid), "");
  // The parent's own reader still works after the fork.
  ASSERT_TRUE(w.Publish(Long(6), 6, &err)) << err;
  EXPECT_TRUE(RunUntilVersion(ctx, 6));
}

// Fork while the reader thread is inside the group's feed (it refuses a long payload that is
// not JSON and logs that through NCCL's logger, held there until the fork): the child must
// not inherit the feed as busy for ever, nor its wake-up in a half state.
TEST_F(Fork, ChildReadsLongTablesAfterAForkWithTheReaderBusy) {
  shm::Segment w;
  std::string err;
  ASSERT_TRUE(w.Create(shm_name_, 2 << 20, &err)) << err;
  ASSERT_TRUE(w.Publish(Doc({Table(group_, 1, 0, 0.0)}), 1, &err)) << err;
  void* ctx = InitGated();
  {
    std::lock_guard<std::mutex> lock(g_gate_mu);
    g_armed = true;
  }
  std::string junk(1 << 20, ' ');
  junk[0] = '[';  // never closed: not JSON, refused by the reader thread
  ASSERT_TRUE(w.Publish(junk, 2, &err)) << err;
  {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::unique_lock<std::mutex> lock(g_gate_mu, std::defer_lock);
    for (;;) {  // the collective hands the payload over; wait until the reader logs
      plugin_->AllReduce(ctx, 1 << 20);
      lock.lock();
      if (g_gate_cv.wait_for(lock, std::chrono::milliseconds(10), [] { return g_inside; }))
        break;
      lock.unlock();
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the reader never refused";
    }
  }
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) Child(w, ctx, 2, 2);
  {
    std::lock_guard<std::mutex> lock(g_gate_mu);
    g_forked = true;
  }
  g_gate_cv.notify_all();
  EXPECT_EQ(Reap(pid), "");
  ASSERT_TRUE(w.Publish(Long(5), 5, &err)) << err;
  EXPECT_TRUE(RunUntilVersion(ctx, 5));
  EXPECT_EQ(plugin_->Stats(ctx).refused, 1u);
}

}  // namespace
