// The disk tier's costs (kvtier/disk_tier.h), on the default model's int8
// block (195,840 bytes) in a temporary directory on this machine's disk:
//   BM_LoadRun/T/S: a 4K-token prompt's 256 blocks loaded and verified by T
//                  threads into memory already touched (files in the page
//                  cache): the load part of a disk hit's TTFT; S = 1: the
//                  blocks sealed (AES-256-GCM, --kv-tier-encryption-key-file);
//   BM_ReadOnly:   the same reads without the checksum;
//   BM_Checksum:   XXH3-128 of the same bytes in memory;
//   BM_IndexAtStart/N: DiskTier::Open of a directory of N block files.
//
//   build/tools/disk_tier_bench [--benchmark_filter=...]
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "kvtier/block_cipher.h"
#include "kvtier/block_codec.h"
#include "kvtier/disk_tier.h"

namespace kvserve::kvtier {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kPayload = 195840;
constexpr int kBlocks = 256;
const Key kSalt = absl::MakeUint128(1, 2);
const Key kNs = absl::MakeUint128(3, 4);

std::string TempDir() {
  std::string t = (fs::temp_directory_path() / "kvtier_bench_XXXXXX").string();
  return mkdtemp(t.data()) != nullptr ? t : "";
}

Key KeyOf(int i) {
  return absl::MakeUint128(static_cast<uint64_t>(i) << 40, i);
}

StoreItem Item(int i) {
  StoreItem it;
  it.header.salt = kSalt;
  it.header.key = KeyOf(i);
  it.header.ns = kNs;
  it.header.payload_bytes = kPayload;
  it.header.tokens.assign(16, i);
  auto bytes = std::make_shared<const std::vector<uint8_t>>(
      kPayload, static_cast<uint8_t>(i));
  it.payload = absl::MakeConstSpan(*bytes);
  it.owner = std::move(bytes);
  return it;
}

std::unique_ptr<DiskTier> Filled(const std::string& dir, int n,
                                 bool sealed = false) {
  DiskTierOptions o;
  o.dir = dir;
  if (sealed) {
    o.cipher = std::make_shared<const BlockCipher>(BlockCipher::KeyBytes{7});
  }
  o.capacity_bytes = uint64_t{64} << 30;
  o.max_queued_blocks = 1 << 20;
  auto t = DiskTier::Open(o, kSalt, 0, kPayload);
  if (!t.ok()) return nullptr;
  for (int i = 0; i < n; ++i) (*t)->Store(Item(i));
  (*t)->Flush(absl::InfiniteFuture());
  return *std::move(t);
}

void BM_LoadRun(benchmark::State& state) {
  const std::string dir = TempDir();
  std::unique_ptr<DiskTier> tier = Filled(dir, kBlocks, state.range(1) != 0);
  const int threads = static_cast<int>(state.range(0));
  std::vector<uint8_t> out(kPayload * kBlocks, 1);  // touched
  std::vector<std::vector<int32_t>> tokens(kBlocks);
  for (int i = 0; i < kBlocks; ++i) tokens[i].assign(16, i);
  for (auto _ : state) {
    std::vector<std::thread> ts;
    ts.reserve(threads);
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        for (int i = kBlocks * t / threads; i < kBlocks * (t + 1) / threads;
             ++i) {
          const Piece p{out.data() + kPayload * i, kPayload};
          const Expected want{kSalt, KeyOf(i), 0, kNs, tokens[i], kPayload};
          if (tier->Load(want, 0, absl::MakeConstSpan(&p, 1)).has_value()) {
            std::abort();
          }
        }
      });
    }
    for (std::thread& t : ts) t.join();
  }
  state.SetBytesProcessed(state.iterations() * kPayload * kBlocks);
  tier.reset();
  fs::remove_all(dir);
}
BENCHMARK(BM_LoadRun)
    ->Args({1, 0})
    ->Args({2, 0})
    ->Args({1, 1})
    ->Args({2, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// As BM_LoadRun, into the pool's layout: 60 planes (30 layers, K and V),
// each block a 3,264-byte slab of each (the CPU backend's KvBlockPieces).
void BM_LoadRunIntoPool(benchmark::State& state) {
  constexpr int kSlabs = 60;
  constexpr size_t kSlab = kPayload / kSlabs;
  const std::string dir = TempDir();
  std::unique_ptr<DiskTier> tier = Filled(dir, kBlocks);
  const int threads = static_cast<int>(state.range(0));
  const int spread = 4;  // the pool holds 4x the loaded blocks
  std::vector<std::vector<uint8_t>> planes(
      kSlabs, std::vector<uint8_t>(kSlab * kBlocks * spread, 1));
  std::vector<std::vector<int32_t>> tokens(kBlocks);
  for (int i = 0; i < kBlocks; ++i) tokens[i].assign(16, i);
  for (auto _ : state) {
    std::vector<std::thread> ts;
    ts.reserve(threads);
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        std::vector<Piece> pieces(kSlabs);
        for (int i = kBlocks * t / threads; i < kBlocks * (t + 1) / threads;
             ++i) {
          for (int p = 0; p < kSlabs; ++p) {
            pieces[p] = {planes[p].data() + kSlab * (i * spread), kSlab};
          }
          const Expected want{kSalt, KeyOf(i), 0, kNs, tokens[i], kPayload};
          if (tier->Load(want, 0, pieces).has_value()) std::abort();
        }
      });
    }
    for (std::thread& t : ts) t.join();
  }
  state.SetBytesProcessed(state.iterations() * kPayload * kBlocks);
  tier.reset();
  fs::remove_all(dir);
}
BENCHMARK(BM_LoadRunIntoPool)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void BM_ReadOnly(benchmark::State& state) {
  const std::string dir = TempDir();
  std::unique_ptr<DiskTier> tier = Filled(dir, kBlocks);
  std::vector<std::string> paths;
  for (const auto& e : fs::recursive_directory_iterator(tier->root())) {
    if (e.is_regular_file()) paths.push_back(e.path().string());
  }
  std::vector<uint8_t> out(kPayload * kBlocks, 1);
  for (auto _ : state) {
    for (size_t i = 0; i < paths.size(); ++i) {
      const int fd = open(paths[i].c_str(), O_RDONLY);
      if (pread(fd, out.data() + kPayload * i, kPayload, kHeaderBytes) < 0) {
        std::abort();
      }
      close(fd);
    }
  }
  state.SetBytesProcessed(state.iterations() * kPayload * kBlocks);
  tier.reset();
  fs::remove_all(dir);
}
BENCHMARK(BM_ReadOnly)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_Checksum(benchmark::State& state) {
  std::vector<uint8_t> bytes(kPayload * kBlocks, 7);
  std::vector<uint8_t> header(kHeaderBytes, 0);
  for (auto _ : state) {
    ChecksumCheck c(header.data());
    c.Add(bytes.data(), bytes.size());
    benchmark::DoNotOptimize(c.Matches());
  }
  state.SetBytesProcessed(state.iterations() * bytes.size());
}
BENCHMARK(BM_Checksum)->Unit(benchmark::kMillisecond);

void BM_IndexAtStart(benchmark::State& state) {
  // Empty block files of the right size: the index reads names and sizes.
  const std::string dir = TempDir();
  const int n = static_cast<int>(state.range(0));
  {
    std::unique_ptr<DiskTier> tier = Filled(dir, 1);
    const uint64_t size = tier->stored_block_bytes();
    for (int i = 1; i < n; ++i) {
      const BlockName name{KeyOf(i), 0, SaltTag(kNs)};
      const std::string sub = tier->root() + "/" + BlockSubdir(name.key);
      fs::create_directories(sub);
      const std::string path = sub + "/" + BlockFileName(name);
      const int fd = open(path.c_str(), O_CREAT | O_WRONLY, 0600);
      if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
        std::abort();
      }
      close(fd);
    }
  }
  for (auto _ : state) {
    DiskTierOptions o;
    o.dir = dir;
    o.capacity_bytes = uint64_t{1} << 50;
    auto t = DiskTier::Open(o, kSalt, 0, kPayload);
    if (!t.ok() || (*t)->stats().indexed_at_start != static_cast<uint64_t>(n)) {
      std::abort();
    }
  }
  fs::remove_all(dir);
}
BENCHMARK(BM_IndexAtStart)
    ->Arg(100000)
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvserve::kvtier

BENCHMARK_MAIN();
