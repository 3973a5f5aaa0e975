#include "cli/logging.h"

#include <memory>

#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace kvserve::cli {

void SetUpLogging(const std::string& level) {
  std::shared_ptr<spdlog::logger> logger = spdlog::get("kvserve");
  if (logger == nullptr) logger = spdlog::stderr_color_mt("kvserve");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

}  // namespace kvserve::cli
