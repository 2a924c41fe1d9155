"""Small helpers over tensors that the recorder and its hooks share."""

import torch


def iter_tensors(obj, depth=0):
    """Tensors inside nested tuples, lists and dicts (model outputs, batches, optimizer state)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 8 and isinstance(obj, (list, tuple)):
        for item in obj:
            yield from iter_tensors(item, depth + 1)
    elif depth < 8 and isinstance(obj, dict):
        for item in obj.values():
            yield from iter_tensors(item, depth + 1)


def resolve_device(device, model, optimizers, inputs):
    """The device a recording keeps: `device`, else that of the model's first parameter
    (or buffer, optimizer parameter, input); None records every device. A CUDA device
    without an index gets the current one."""
    if device is None:
        candidates = []
        if model is not None:
            candidates.append(next(iter(model.parameters()), None))
            candidates.append(next(iter(model.buffers()), None))
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                candidates.extend(group["params"][:1])
        candidates.extend(list(iter_tensors(inputs))[:1])
        device = next((t.device for t in candidates if t is not None), None)
        if device is None:
            return None
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        device = torch.device("cuda", index)
    return device
