"""vramscope_trace: the trace recorder's former name, an alias of `vramscope.trace`.

`import vramscope_trace` and `import vramscope_trace.recorder` (any submodule) give the
very modules of vramscope.trace, so objects and classes are shared between both names.
"""

import importlib
import importlib.abc
import importlib.util
import sys

_TARGET = "vramscope.trace"


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports vramscope_trace.X as vramscope.trace.X (the same module object)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(_TARGET + spec.name[len(__name__):])

    def exec_module(self, module):
        pass  # already executed under its own name


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())

sys.modules[__name__] = importlib.import_module(_TARGET)
