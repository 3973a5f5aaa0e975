// Tenants in the scheduler (scheduler/fair_share.h): aging bounds the wait
// behind a priority flood, cache-aware admission bounds how often a fresh
// prompt is passed over, tenants below their share go first and keep
// their running requests, forks never raise the running sequences past
// max_num_seqs, a short request joins within one step of any number of long
// prefills, and prefill tokens are split by tenant weight. Every case counts
// steps; none is timed.
#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/fair_share.h"
#include "scheduler/scheduler.h"

namespace kvserve::scheduler {
namespace {

constexpr int64_t kMs = 1'000'000;  // ns

struct Spec {
  RequestId id;
  int32_t prompt = 4;
  int32_t max_tokens = 1;
  int32_t priority = 0;
  int64_t arrival_ns = 0;
  std::string tenant;
  int32_t weight = 1;
  int32_t max_running = 0;
  int32_t completions = 1;
  // First prompt tokens shared with every request of the same `prefix`
  // (>= 0), so that the prefix cache can match them.
  int32_t prefix = -1;
  int32_t prefix_len = 0;
};

std::unique_ptr<Request> Make(const Spec& s) {
  std::vector<int32_t> prompt(s.prompt);
  for (int32_t i = 0; i < s.prompt; ++i) {
    prompt[i] = i < s.prefix_len ? 50000 + s.prefix * 1000 + i
                                 : static_cast<int32_t>(s.id * 1000 + i);
  }
  auto r = std::make_unique<Request>(s.id, std::move(prompt), s.max_tokens,
                                     s.priority, s.arrival_ns);
  r->set_tenant({s.tenant, s.weight, s.max_running});
  r->set_num_completions(s.completions);
  return r;
}

// Drives a scheduler with a model that samples token 7 for everyone.
class Driver {
 public:
  explicit Driver(const SchedulerConfig& c) : sched_(c) {}
  Scheduler& sched() { return sched_; }

  void Add(const Spec& s) {
    const absl::Status st = sched_.AddRequest(Make(s));
    ASSERT_TRUE(st.ok()) << st;
  }

  // One step; returns it. Records the step each request was first
  // scheduled in, and checks the invariants.
  SchedulerOutput Step() {
    SchedulerOutput out = sched_.Schedule();
    for (const ScheduledRequest& s : out.scheduled) {
      first_step_.try_emplace(s.id, out.step);
      if (s.produces_token && !first_token_.contains(s.id)) {
        first_token_[s.id] = out.step;
      }
    }
    max_running_ = std::max(max_running_, sched_.num_running());
    std::vector<int32_t> sampled(out.num_producing(), 7);
    last_finished_ = sched_.UpdateFromOutput(out, sampled);
    const absl::Status s = sched_.CheckInvariants();
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  // The step `id` was first scheduled in (-1: never).
  int64_t FirstStep(RequestId id) const {
    auto it = first_step_.find(id);
    return it == first_step_.end() ? -1 : it->second;
  }
  int64_t FirstToken(RequestId id) const {
    auto it = first_token_.find(id);
    return it == first_token_.end() ? -1 : it->second;
  }
  int32_t max_running() const { return max_running_; }
  const std::vector<FinishedRequest>& last_finished() const {
    return last_finished_;
  }

 private:
  Scheduler sched_;
  std::map<RequestId, int64_t> first_step_, first_token_;
  std::vector<FinishedRequest> last_finished_;
  int32_t max_running_ = 0;
};

SchedulerConfig Config() {
  SchedulerConfig c;
  c.max_num_seqs = 1;
  c.max_num_batched_tokens = 64;
  c.block_size = 4;
  c.num_blocks = 256;
  c.watermark = 0;
  c.max_model_len = 4096;
  c.enable_prefix_caching = false;
  return c;
}

// A flood of priority -10 requests, two arriving per step (one step = 100
// ms of their clock), one served per step, keeps a priority-0 request
// waiting forever without aging. With one level per 100 ms, it goes before
// every flood request that arrived more than 10 levels x 100 ms after it:
// only the 20 that arrived in its first 10 steps are served before it.
TEST(AgingTest, BoundsTheWaitBehindAPriorityFlood) {
  for (const double aging : {0.0, 0.1}) {
    SCOPED_TRACE(aging);
    SchedulerConfig c = Config();
    c.policy = SchedulingPolicy::kPriority;
    c.priority_aging_seconds = aging;
    Driver d(c);
    d.Add({.id = 1, .priority = 0, .arrival_ns = 0});
    RequestId next = 100;
    for (int step = 0; step < 60; ++step) {
      for (int k = 0; k < 2; ++k) {
        d.Add({.id = next++, .priority = -10, .arrival_ns = step * 100 * kMs});
      }
      d.Step();
    }
    if (aging == 0) {
      EXPECT_EQ(d.FirstStep(1), -1) << "starved without aging";
    } else {
      EXPECT_EQ(d.FirstStep(1), 20);
    }
  }
}

// Priority preemption takes victims only from the head's own tenant or
// from tenants at or above their share: a flood of urgent requests from
// tenant a does not evict tenant b's only running request.
TEST(FairShareTest, PriorityPreemptionSparesATenantBelowItsShare) {
  SchedulerConfig c = Config();
  c.policy = SchedulingPolicy::kPriority;
  c.max_num_seqs = 4;
  c.num_blocks = 12;  // 48 tokens: b's request and one of a's
  Driver d(c);
  d.Add(
      {.id = 1, .prompt = 24, .max_tokens = 8, .priority = 10, .tenant = "b"});
  d.Step();
  for (RequestId id = 10; id < 14; ++id) {
    d.Add({.id = id,
           .prompt = 28,
           .max_tokens = 8,
           .priority = -10,
           .tenant = "a"});
  }
  for (int step = 0; step < 40 && d.sched().GetRequest(1) != nullptr; ++step) {
    const SchedulerOutput out = d.Step();
    EXPECT_THAT(out.preempted, ::testing::Not(::testing::Contains(1)));
  }
  EXPECT_EQ(d.sched().GetRequest(1), nullptr) << "b's request ran to its end";
  EXPECT_EQ(d.sched().stats().num_priority_preemptions_recompute_total, 0);
}

// Among one tenant, priority preemption works as before.
TEST(FairShareTest, PriorityPreemptionWithinATenant) {
  SchedulerConfig c = Config();
  c.policy = SchedulingPolicy::kPriority;
  c.max_num_seqs = 4;
  c.num_blocks = 12;
  Driver d(c);
  d.Add({.id = 1, .prompt = 24, .max_tokens = 8, .priority = 10});
  d.Step();
  d.Add({.id = 2,
         .prompt = 28,
         .max_tokens = 8,
         .priority = -10,
         .arrival_ns = 1});
  const SchedulerOutput out = d.Step();
  EXPECT_THAT(out.preempted, ::testing::ElementsAre(1));
}

// A tenant below its share of max_num_seqs goes first: b's one request is
// admitted at the first free seat, before a's queue.
TEST(FairShareTest, TheTenantBelowItsShareIsAdmittedAtTheNextFreeSeat) {
  SchedulerConfig c = Config();
  c.max_num_seqs = 4;
  Driver d(c);
  for (RequestId id = 1; id <= 10; ++id) {
    d.Add(
        {.id = id, .max_tokens = 2 + static_cast<int32_t>(id), .tenant = "a"});
  }
  d.Step();
  EXPECT_EQ(d.sched().num_running(), 4);
  d.Add({.id = 99, .tenant = "b"});
  // Request 1 ends after its third token (step 2); b goes at step 3, not
  // a's request 5.
  for (int i = 0; i < 4; ++i) d.Step();
  EXPECT_EQ(d.FirstStep(99), 3);
  EXPECT_EQ(d.FirstStep(5), 4);
}

// Weights: with both tenants flooding, a (weight 3) holds three of the
// four seats and b (weight 1) one, once the first requests turn over.
TEST(FairShareTest, SeatsFollowTheWeights) {
  SchedulerConfig c = Config();
  c.max_num_seqs = 4;
  Driver d(c);
  RequestId id = 1;
  for (int k = 0; k < 40; ++k) {
    d.Add({.id = id++, .max_tokens = 3, .tenant = "b", .weight = 1});
  }
  for (int k = 0; k < 40; ++k) {
    d.Add({.id = id++, .max_tokens = 3, .tenant = "a", .weight = 3});
  }
  std::map<std::string, int> seats;
  for (int step = 0; step < 12; ++step) {
    d.Step();
    if (step < 6) continue;
    for (RequestId r : d.sched().RunningIds()) {
      ++seats[d.sched().GetRequest(r)->tenant().name];
    }
  }
  EXPECT_EQ(seats["a"], 3 * seats["b"]) << seats["a"] << " vs " << seats["b"];
}

// A tenant's max_running caps it even when seats are free.
TEST(FairShareTest, MaxRunningCapsATenant) {
  SchedulerConfig c = Config();
  c.max_num_seqs = 8;
  Driver d(c);
  for (RequestId id = 1; id <= 6; ++id) {
    d.Add({.id = id, .max_tokens = 4, .tenant = "a", .max_running = 2});
  }
  for (int step = 0; step < 20; ++step) d.Step();
  EXPECT_EQ(d.max_running(), 2);
  EXPECT_FALSE(d.sched().has_work());
  EXPECT_EQ(d.sched().stats().last_admission_stop, AdmissionStop::kQueueEmpty);
}

// n completions hold n seats from admission: a request of 4 completions
// waits until 4 seats are free, its forks take them, and the running count
// never passes max_num_seqs (it did before: forks joined past it).
TEST(FairShareTest, ForksTakeSeatsReservedAtAdmission) {
  SchedulerConfig c = Config();
  c.max_num_seqs = 6;
  Driver d(c);
  d.Add({.id = 1, .max_tokens = 6, .completions = 4});
  d.Add({.id = 3, .max_tokens = 6});
  d.Add({.id = 2, .max_tokens = 6, .completions = 4});
  d.Step();  // 1 (4 seats) and 3 (1 seat) admitted; 2 needs 4 of 1 left
  EXPECT_THAT(d.sched().RunningIds(), ::testing::ElementsAre(1, 3));
  EXPECT_EQ(d.sched().num_running_seats(), 5);
  // The engine forks 1's children after its prompt (here: three).
  RequestId child = 10;
  for (int k = 0; k < 3; ++k) {
    auto r = Make({.id = child++, .max_tokens = 6});
    std::vector<int32_t> prompt = d.sched().GetRequest(1)->prompt_token_ids();
    r = std::make_unique<Request>(r->id(), prompt, 6);
    r->set_output_token_ids({7});
    ASSERT_TRUE(d.sched().Fork(1, std::move(r)).ok());
  }
  d.sched().EndForks(1);
  EXPECT_EQ(d.sched().num_running(), 5);
  EXPECT_EQ(d.sched().num_running_seats(), 5);
  for (int step = 0; step < 30; ++step) d.Step();
  EXPECT_LE(d.max_running(), 6);
  EXPECT_GT(d.FirstStep(2), 0);
  // A request that could never have its seats is refused.
  auto big = Make({.id = 50, .completions = 7});
  const absl::Status s = d.sched().AddRequest(std::move(big));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("over max_num_seqs"));
}

// EndForks gives back the seats of completions that never forked.
TEST(FairShareTest, EndForksReleasesUnforkedSeats) {
  SchedulerConfig c = Config();
  c.max_num_seqs = 4;
  Driver d(c);
  d.Add({.id = 1, .max_tokens = 6, .completions = 4});
  d.Step();
  EXPECT_EQ(d.sched().num_running_seats(), 4);
  d.sched().EndForks(1);
  EXPECT_EQ(d.sched().num_running_seats(), 1);
  d.Add({.id = 2, .max_tokens = 2});
  d.Step();
  EXPECT_EQ(d.FirstStep(2), 1);
}

// Four 2,000-token prompts prefill 512 tokens a step; a 50-token request
// arriving after they started is scheduled whole in the next step (its
// first token one step after arrival), where it used to wait for all of
// them, and that step is small (its 50 tokens and as many for the long
// ones), so it costs about twice the request's idle prefill. The step
// after is whole again.
TEST(PrefillShareTest, AShortRequestJoinsWithinOneStepOfLongPrefills) {
  SchedulerConfig c = Config();
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 512;
  c.long_prefill_token_threshold = 256;
  c.num_blocks = 4096;
  c.max_model_len = 8192;
  Driver d(c);
  for (RequestId id = 1; id <= 4; ++id) {
    d.Add({.id = id, .prompt = 2000, .max_tokens = 4});
  }
  d.Step();
  d.Step();
  d.Add({.id = 9, .prompt = 50, .max_tokens = 4});
  const SchedulerOutput out = d.Step();
  EXPECT_EQ(d.FirstToken(9), out.step);
  EXPECT_EQ(out.total_num_tokens, 100);
  EXPECT_EQ(d.Step().total_num_tokens, 512);  // whole again
  for (int i = 0; i < 40; ++i) d.Step();
  EXPECT_FALSE(d.sched().has_work());
}

// A long newcomer (past the threshold) waits for what the running prefills
// leave, as before: the share is for short requests.
TEST(PrefillShareTest, ALongNewcomerTakesWhatIsLeft) {
  SchedulerConfig c = Config();
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 512;
  c.long_prefill_token_threshold = 256;
  c.num_blocks = 4096;
  c.max_model_len = 8192;
  Driver d(c);
  for (RequestId id = 1; id <= 2; ++id) {
    d.Add({.id = id, .prompt = 2000, .max_tokens = 4});
  }
  d.Step();
  d.Add({.id = 9, .prompt = 1000, .max_tokens = 4});
  d.Step();
  EXPECT_EQ(d.FirstStep(9), -1);
}

// Prefill tokens are split by weight between tenants that both prefill:
// 3:1 of the 400 tokens a step (threshold 300 each).
TEST(PrefillShareTest, TenantsSplitPrefillTokensByWeight) {
  SchedulerConfig c = Config();
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 400;
  c.long_prefill_token_threshold = 300;
  c.num_blocks = 4096;
  c.max_model_len = 8192;
  Driver d(c);
  d.Add({.id = 1, .prompt = 3000, .max_tokens = 2, .tenant = "a", .weight = 3});
  d.Add({.id = 2, .prompt = 3000, .max_tokens = 2, .tenant = "b", .weight = 1});
  d.Step();  // admission in queue order: 1 takes 300, 2 takes 100
  const SchedulerOutput out = d.Step();
  std::map<RequestId, int32_t> got;
  for (const ScheduledRequest& s : out.scheduled) got[s.id] = s.num_new_tokens;
  EXPECT_EQ(got[1], 300);
  EXPECT_EQ(got[2], 100);
}

// Cache-aware admission passes a fresh prompt over for better-cached ones
// at most kCacheAwareMaxPasses times, however many keep arriving.
TEST(CacheAwareAgingTest, AFreshPromptIsPassedOverAtMostMaxPassesTimes) {
  SchedulerConfig c = Config();
  c.policy = SchedulingPolicy::kCacheAware;
  c.enable_prefix_caching = true;
  c.max_num_seqs = 1;
  Driver d(c);
  // Warm the cache with a 64-token prefix.
  d.Add(
      {.id = 1, .prompt = 72, .max_tokens = 1, .prefix = 0, .prefix_len = 64});
  for (int i = 0; i < 4; ++i) d.Step();
  d.Add({.id = 2, .prompt = 20, .max_tokens = 1});  // fresh
  RequestId next = 100;
  int admitted_before = 0;
  for (int step = 0; step < 40 && d.FirstStep(2) < 0; ++step) {
    d.Add({.id = next++,
           .prompt = 72,
           .max_tokens = 1,
           .prefix = 0,
           .prefix_len = 64});
    const SchedulerOutput out = d.Step();
    for (const ScheduledRequest& s : out.scheduled) {
      admitted_before += s.id >= 100 && d.FirstStep(2) < 0 ? 1 : 0;
    }
  }
  EXPECT_GE(d.FirstStep(2), 0);
  EXPECT_EQ(admitted_before, kCacheAwareMaxPasses);
}

// Random traffic of three tenants (weights, a cap, shared and private
// scopes, n > 1 requests, aborts) under every policy: the invariants hold
// every step (CheckInvariants: seats equal the running requests'), running
// sequences never pass max_num_seqs nor a tenant its cap, and everything
// finishes.
TEST(TenantSoakTest, RandomTenantsKeepInvariantsAndLimits) {
  for (const SchedulingPolicy policy :
       {SchedulingPolicy::kFcfs, SchedulingPolicy::kPriority,
        SchedulingPolicy::kCacheAware}) {
    SCOPED_TRACE(SchedulingPolicyName(policy));
    SchedulerConfig c = Config();
    c.policy = policy;
    c.max_num_seqs = 6;
    c.max_num_batched_tokens = 48;
    c.long_prefill_token_threshold = 16;
    c.num_blocks = 48;
    c.max_model_len = 128;
    c.enable_prefix_caching = true;
    Driver d(c);
    std::mt19937 rng(static_cast<int>(policy) + 11);
    auto pick = [&](int n) {
      return std::uniform_int_distribution<int>(0, n - 1)(rng);
    };
    const std::string names[] = {"a", "b", "c"};
    RequestId next = 1;
    for (int step = 0; step < 1500; ++step) {
      if (pick(2) == 0) {
        const int t = pick(3);
        auto r = Make({.id = next++,
                       .prompt = 1 + pick(60),
                       .max_tokens = 1 + pick(20),
                       .priority = pick(5) - 2,
                       .arrival_ns = step * kMs,
                       .tenant = names[t],
                       .weight = t + 1,
                       .max_running = t == 2 ? 2 : 0,
                       .completions = 1 + pick(3),
                       .prefix = pick(2),
                       .prefix_len = pick(40)});
        r->set_cache_scope(t == 0 ? "tenant:a" : "scope:shared", t != 0);
        (void)d.sched().AddRequest(std::move(r));
      }
      if (pick(20) == 0 && d.sched().num_running() > 0) {
        const std::vector<RequestId> ids = d.sched().RunningIds();
        (void)d.sched().Abort(ids[pick(static_cast<int>(ids.size()))]);
      }
      d.Step();
      // The engine forks nothing here: the reserved seats come back.
      for (RequestId id : d.sched().RunningIds()) d.sched().EndForks(id);
      ASSERT_LE(d.sched().num_running_seats(), c.max_num_seqs);
      int c_running = 0;
      for (RequestId id : d.sched().RunningIds()) {
        c_running += d.sched().GetRequest(id)->tenant().name == "c";
      }
      ASSERT_LE(c_running, 2);
    }
    for (int i = 0; i < 2000 && d.sched().has_work(); ++i) d.Step();
    EXPECT_FALSE(d.sched().has_work());
    // The last step's cached-tail sources stay pinned until the next one.
    EXPECT_TRUE(d.sched().Schedule().empty());
    EXPECT_EQ(d.sched().kv_usage().active_blocks, 0);
  }
}

TEST(WaterFillTest, SplitsByWeightAndRedistributesWhatCappedOnesLeave) {
  EXPECT_THAT(WaterFill({100, 100}, {3, 1}, 80),
              ::testing::ElementsAre(60, 20));
  EXPECT_THAT(WaterFill({10, 100}, {1, 1}, 80), ::testing::ElementsAre(10, 70));
  EXPECT_THAT(WaterFill({10, 10}, {1, 1}, 80), ::testing::ElementsAre(10, 10));
  EXPECT_THAT(WaterFill({5, 5, 5}, {1, 1, 1}, 4),
              ::testing::ElementsAre(2, 1, 1));
  EXPECT_THAT(WaterFill({0, 7}, {1, 1}, 3), ::testing::ElementsAre(0, 3));
}

}  // namespace
}  // namespace kvserve::scheduler
