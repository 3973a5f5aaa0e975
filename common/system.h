// Facts about the host the process runs on, read once per call.
#pragma once

#include <cstdint>

namespace kvserve {

// Physical memory in bytes (sysconf); 0 when the system does not say.
[[nodiscard]] int64_t PhysicalMemoryBytes();

}  // namespace kvserve
