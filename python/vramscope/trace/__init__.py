"""vramscope.trace: record the tensor-storage memory events of a PyTorch training step.

    import vramscope.trace
    with vramscope.trace.record("step.events", model=model, optimizer=optimizer):
        ...one or two training steps...

The file follows vramscope's event-stream format (docs/event-stream.md) and is read by
`vramscope simulate` (or vramscope.simulate). See docs/trace-recorder.md. Pure Python: it
needs torch, not the engine module. `vramscope_trace` is an alias of this package.
"""

from .api import record, record_step
from .recorder import Recorder, __version__
from .result import RecordResult
from .replay import ReplaySummary, replay

__all__ = ["record", "record_step", "Recorder", "RecordResult", "replay", "ReplaySummary",
           "__version__"]
