#include "common/thread_owner.h"

#include <thread>

#include "gtest/gtest.h"

namespace kvserve {
namespace {

// Runs `f` on a fresh thread and waits for it.
template <typename F>
void OnOtherThread(F f) {
  std::thread t(f);
  t.join();
}

TEST(ThreadOwnerTest, FirstUseBindsTheOwner) {
  ThreadOwner owner;
  EXPECT_TRUE(owner.IsOwnerThread());
  bool other_is_owner = true;
  OnOtherThread([&] { other_is_owner = owner.IsOwnerThread(); });
  EXPECT_FALSE(other_is_owner);
  EXPECT_TRUE(owner.IsOwnerThread());
}

TEST(ThreadOwnerTest, FirstUseOnAnotherThreadBindsThatThread) {
  ThreadOwner owner;  // built here, used there first
  bool other_is_owner = false;
  OnOtherThread([&] { other_is_owner = owner.IsOwnerThread(); });
  EXPECT_TRUE(other_is_owner);
  EXPECT_FALSE(owner.IsOwnerThread());
}

TEST(ThreadOwnerTest, RebindHandsOwnershipOver) {
  ThreadOwner owner;
  owner.CheckOwner("test");
  bool other_is_owner = false;
  OnOtherThread([&] {
    owner.Rebind();
    owner.CheckOwner("test");
    other_is_owner = owner.IsOwnerThread();
  });
  EXPECT_TRUE(other_is_owner);
  EXPECT_FALSE(owner.IsOwnerThread());
  owner.Rebind();
  EXPECT_TRUE(owner.IsOwnerThread());
}

TEST(ThreadOwnerTest, CopiesBindOnTheirOwnFirstUse) {
  ThreadOwner owner;
  owner.CheckOwner("test");
  bool copy_owned_there = false;
  OnOtherThread([&] {
    ThreadOwner copy(owner);
    copy_owned_there = copy.IsOwnerThread();
  });
  EXPECT_TRUE(copy_owned_there);
}

// Where KV_DCHECK is on (debug and sanitizer builds), a call from another
// thread aborts naming the object; elsewhere the check is compiled out.
TEST(ThreadOwnerDeathTest, CheckFromAnotherThreadAbortsWhenDChecksAreOn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ThreadOwner owner;
  owner.CheckOwner("Widget");
  auto from_other = [&] { OnOtherThread([&] { owner.CheckOwner("Widget"); }); };
  if (KV_DCHECK_IS_ON) {
    EXPECT_DEATH(from_other(),
                 "Widget called from a thread other than its owner");
  } else {
    from_other();
  }
}

}  // namespace
}  // namespace kvserve
