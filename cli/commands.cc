#include "command.h"

namespace vramscope::cli {

extern const CommandSpec kEstimateCommand;
extern const CommandSpec kSimulateCommand;
extern const CommandSpec kGpusCommand;
extern const CommandSpec kExplainCommand;
extern const CommandSpec kReplayCommand;
extern const CommandSpec kCompareCommand;
extern const CommandSpec kFitCommand;
extern const CommandSpec kSweepCommand;
extern const CommandSpec kPlanCommand;
extern const CommandSpec kModelsCommand;
extern const CommandSpec kValidateCommand;

const std::vector<CommandSpec>& Commands() {
  static const std::vector<CommandSpec> table = {
      kEstimateCommand, kSimulateCommand, kGpusCommand,     kExplainCommand,
      kReplayCommand,   kCompareCommand,  kFitCommand,      kSweepCommand,
      kPlanCommand,     kModelsCommand,   kValidateCommand,
  };
  return table;
}

const CommandSpec* FindCommand(std::string_view name) {
  for (const CommandSpec& spec : Commands()) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

}  // namespace vramscope::cli
