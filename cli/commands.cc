#include "command.h"

namespace vramscope::cli {

extern const CommandSpec kEstimateCommand;
extern const CommandSpec kSimulateCommand;
extern const CommandSpec kGpusCommand;

const std::vector<CommandSpec>& Commands() {
  static const std::vector<CommandSpec> table = {
      kEstimateCommand,
      kSimulateCommand,
      kGpusCommand,
  };
  return table;
}

}  // namespace vramscope::cli
