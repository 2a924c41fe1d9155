#include "command.h"

namespace vramscope::cli {

extern const CommandSpec kEstimateCommand;
extern const CommandSpec kSimulateCommand;
extern const CommandSpec kGpusCommand;
extern const CommandSpec kModelsCommand;
extern const CommandSpec kModelsCommand;
extern const CommandSpec kValidateCommand;

const std::vector<CommandSpec>& Commands() {
  static const std::vector<CommandSpec> table = {
      kEstimateCommand,
      kSimulateCommand,
      kGpusCommand,
      kModelsCommand,
      kModelsCommand,
      kValidateCommand,
  };
  return table;
}

}  // namespace vramscope::cli
