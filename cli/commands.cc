#include "command.h"

namespace vramscope::cli {

extern const CommandSpec kEstimateCommand;
extern const CommandSpec kSimulateCommand;
extern const CommandSpec kGpusCommand;
extern const CommandSpec kFitCommand;
extern const CommandSpec kSweepCommand;
extern const CommandSpec kPlanCommand;
extern const CommandSpec kModelsCommand;
extern const CommandSpec kModelsCommand;
extern const CommandSpec kValidateCommand;

const std::vector<CommandSpec>& Commands() {
  static const std::vector<CommandSpec> table = {
      kEstimateCommand,
      kSimulateCommand,
      kGpusCommand,
      kFitCommand,
      kSweepCommand,
      kPlanCommand,
      kModelsCommand,
      kModelsCommand,
      kValidateCommand,
  };
  return table;
}

}  // namespace vramscope::cli
