#include "engine/runner/device.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvserve::engine {
namespace {

using ::testing::HasSubstr;

TEST(DeviceTest, ParsesEachNameBackToItself) {
  for (Device d : {Device::kCpu, Device::kCuda, Device::kAuto}) {
    absl::StatusOr<Device> parsed = ParseDevice(DeviceName(d));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, d);
  }
}

TEST(DeviceTest, UnknownNameIsRefusedNamingTheFlag) {
  absl::StatusOr<Device> bad = ParseDevice("tpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("--device"));
  EXPECT_THAT(bad.status().message(), HasSubstr("tpu"));
  EXPECT_FALSE(ParseDevice("CPU").ok());
}

}  // namespace
}  // namespace kvserve::engine
