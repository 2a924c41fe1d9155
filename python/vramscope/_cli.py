"""The `vramscope` console script: the C++ command line, run in this process."""

import os
import sys


def main() -> int:
    from . import _core
    _core.tune_malloc()  # as the vramscope executable does (cli/malloc_tuning.cc)
    sys.stdout.flush()
    # The arguments as the bytes the program was given: Python decodes argv
    # with surrogateescape, and a str holding a lone surrogate (a file name
    # that is not UTF-8) cannot cross into C++ as text. os.fsencode gives the
    # original bytes back, which the command line reads as the executable does.
    argv = [os.fsencode(arg) for arg in ["vramscope"] + sys.argv[1:]]
    return _core.cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
