"""The `vramscope` console script: the C++ command line, run in this process."""

import sys


def main() -> int:
    from . import _core
    _core.tune_malloc()  # as the vramscope executable does (cli/malloc_tuning.cc)
    sys.stdout.flush()
    code = _core.cli_main(["vramscope"] + sys.argv[1:])
    return code


if __name__ == "__main__":
    sys.exit(main())
