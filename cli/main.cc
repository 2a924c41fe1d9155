// vramscope: where will my GPU memory go? A thin shell over the core library:
// parse flags, call the library, print, map errors to exit codes (RunCli,
// cli/run_cli.cc, which the Python package's console script shares).
#include "command.h"

int main(int argc, char** argv) { return vramscope::cli::RunCli(argc, argv); }
