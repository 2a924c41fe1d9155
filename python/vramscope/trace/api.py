"""The two entry points: `record` (a context manager) and `record_step` (a ready-made loop)."""

import contextlib

import torch

from .recorder import Recorder


@contextlib.contextmanager
def record(path, model=None, optimizer=None, inputs=None, device=None, meta=()):
    """Records the memory events of the code in the `with` block into `path`.

        with vramscope.trace.record("step.events", model=model, optimizer=optimizer) as rec:
            loss = loss_fn(model(x), y); loss.backward(); optimizer.step()
        print(rec.result.peak_live_bytes)

    The file is written when the block ends, also when it ends with an exception (the
    exception then propagates). See Recorder for the arguments.
    """
    recorder = Recorder(path, model=model, optimizer=optimizer, inputs=inputs, device=device,
                        meta=meta)
    recorder.start()
    try:
        yield recorder
    finally:
        recorder.stop()


def _call_model(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (list, tuple)):
        return model(*inputs)
    return model(inputs)


def _loss_of(output):
    loss = getattr(output, "loss", None)  # Hugging Face model outputs carry their loss
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, torch.Tensor):
        return output
    raise TypeError("record_step: without loss_fn the model must return the loss "
                    f"(a tensor or an object with .loss), got {type(output).__name__}")


def record_step(model, batch, loss_fn, optimizer, steps=2, path="step.events", device=None,
                meta=()):
    """Runs `steps` training steps of a standard loop under the recorder; returns a RecordResult.

    Each step is: optimizer.zero_grad(set_to_none=True); output = model(inputs);
    loss = loss_fn(output, target); loss.backward(); del output, loss; optimizer.step().

    batch: `(inputs, target)`; inputs is a tensor (model(inputs)), a tuple or list
        (model(*inputs)) or a dict (model(**inputs)). A batch that is not a 2-tuple/list is
        taken as the inputs alone, with target None.
    loss_fn: loss_fn(output, target) -> scalar tensor, or None when the model returns the
        loss itself (a tensor, or an object with a `.loss` tensor such as a Hugging Face
        output).
    optimizer: a torch.optim optimizer, or None for forward and backward only.
    steps: 2 by default: the first step creates the optimizer state, the second one shows
        the steady state.
    """
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        inputs, target = batch
    else:
        inputs, target = batch, None
    with record(path, model=model, optimizer=optimizer, inputs=batch, device=device,
                meta=meta) as recorder:
        for _ in range(steps):
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            output = _call_model(model, inputs)
            loss = loss_fn(output, target) if loss_fn is not None else _loss_of(output)
            loss.backward()
            del output, loss
            if optimizer is not None:
                optimizer.step()
    return recorder.result
