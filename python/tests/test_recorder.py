"""Behaviour of the recorder on small programs whose allocations are known exactly."""

import weakref

import pytest
import torch
from torch import nn

import vramscope_trace
from event_stream_check import check_file
from vramscope_trace import _torch_compat


def events_of(path):
    """The file's a/f/p/e records with string indexes resolved, after checking the format."""
    check_file(path)
    strings = {0: ""}
    events = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            tokens = line.split()
            if tokens[0] == "s":
                strings[int(tokens[1])] = line.split(None, 2)[2].rstrip("\n")
            elif tokens[0] == "a":
                op = strings[int(tokens[4])] if len(tokens) > 4 else ""
                module = strings[int(tokens[5])] if len(tokens) > 5 else ""
                events.append(("a", int(tokens[1]), int(tokens[2]), tokens[3], op, module))
            elif tokens[0] == "f":
                events.append(("f", int(tokens[1])))
            elif tokens[0] == "p":
                events.append(("p", int(tokens[1]), tokens[2]))
            elif tokens[0] == "e":
                events.append(("e",))
    return events


def allocs(events):
    return [e for e in events if e[0] == "a"]


def nbytes(tensor):
    return tensor.numel() * tensor.element_size()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def test_views_and_in_place_ops_allocate_nothing(tmp_path):
    path = tmp_path / "t.events"
    with vramscope_trace.record(path):
        x = torch.randn(256)
        views = [x[10:], x.view(16, 16), x.view(16, 16).t(), x.reshape(2, 128), x.unsqueeze(0)]
        x.add_(1).mul_(2)
        views[1].zero_()
    events = events_of(path)
    assert [(e[2], e[4]) for e in allocs(events)] == [(1024, "aten::randn")]


def test_a_storage_is_freed_when_its_last_view_dies(tmp_path):
    path = tmp_path / "t.events"
    with vramscope_trace.record(path):
        x = torch.randn(256)
        view = x[1:]
        del x
        torch.randn(1)  # x still lives through `view`
        del view
        torch.randn(2)  # x is gone before this allocation
    events = [e[:3] for e in events_of(path)]
    # Frees found at the same check come in allocation order.
    assert events == [("a", 1, 1024), ("a", 2, 4), ("f", 1), ("f", 2), ("a", 3, 8), ("f", 3)]


def test_the_recorder_keeps_no_tensor_alive(tmp_path):
    with vramscope_trace.record(tmp_path / "t.events"):
        x = torch.randn(1000)
        ref = weakref.ref(x)
        storage_ref = _torch_compat.new_weak_ref(_torch_compat.untyped_storage(x))
        del x
        assert ref() is None
        assert _torch_compat.weak_ref_expired(storage_ref)
        _torch_compat.free_weak_ref(storage_ref)


def test_state_that_exists_before_recording_is_allocated_in_setup(tmp_path):
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 16)).sum().backward()
    optimizer.step()
    batch = torch.randn(5, 16)
    path = tmp_path / "t.events"
    with vramscope_trace.record(path, model=model, optimizer=optimizer, inputs=batch):
        pass
    events = events_of(path)
    assert all(e[0] == "a" for e in events)  # nothing but setup allocations
    by_category = {}
    for e in events:
        by_category[e[3]] = by_category.get(e[3], 0) + e[2]
    param_bytes = sum(nbytes(p) for p in model.parameters())
    step_counters = sum(nbytes(s["step"]) for s in optimizer.state.values())
    assert by_category == {"param": param_bytes, "grad": param_bytes,
                           "optim": 2 * param_bytes + step_counters, "other": nbytes(batch)}
    modules = {e[5] for e in events if e[3] == "param"}
    assert modules == {"model.0", "model.2"}


def test_a_training_step_has_phases_categories_and_modules(tmp_path):
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters())
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    path = tmp_path / "t.events"
    result = vramscope_trace.record_step(model, batch, nn.functional.cross_entropy, optimizer,
                                         steps=2, path=path)
    events = events_of(path)
    assert [e[1:] for e in events if e[0] == "p"] == [
        (1, "forward"), (1, "backward"), (1, "optimizer"),
        (2, "forward"), (2, "backward"), (2, "optimizer")]
    assert result.steps == 2

    def in_phase(step, phase):
        out, current = [], (0, "setup")
        for e in events:
            if e[0] == "p":
                current = e[1:]
            elif e[0] == "a" and current == (step, phase):
                out.append(e)
        return out

    param_bytes = sum(nbytes(p) for p in model.parameters())
    for step in (1, 2):
        forward = in_phase(step, "forward")
        # ReLU's output is saved for backward: the only activation.
        assert [(e[2], e[4], e[5]) for e in forward if e[3] == "act"] == [
            (8 * 32 * 4, "aten::relu", "model.1")]
        # Logits, log-probabilities and the loss.
        assert {e[4] for e in forward if e[3] == "loss"} >= {"aten::addmm", "aten::_log_softmax"}
        # One gradient per parameter, attributed to the parameter's module.
        grads = [e for e in in_phase(step, "backward") if e[3] == "grad"]
        assert sum(e[2] for e in grads) == param_bytes
        assert {e[5] for e in grads} == {"model.0", "model.2"}
    optim = [e for e in in_phase(1, "optimizer") if e[3] == "optim"]
    step_counters = sum(nbytes(s["step"]) for s in optimizer.state.values())
    assert sum(e[2] for e in optim) == 2 * param_bytes + step_counters
    assert not [e for e in in_phase(2, "optimizer") if e[3] == "optim"]
    assert {e[3] for e in in_phase(2, "optimizer")} <= {"temp"}


def test_backward_ops_are_attributed_to_the_module_that_made_their_node(tmp_path):
    model = mlp()
    x = torch.randn(8, 16)
    path = tmp_path / "t.events"
    with vramscope_trace.record(path, model=model):
        model(x).sum().backward()
    events = events_of(path)
    start = events.index(("p", 1, "backward"))
    backward = allocs(events[start:])
    relu_grad = [e for e in backward if e[4] == "aten::threshold_backward"]
    assert [e[5] for e in relu_grad] == ["model.1"]
    first_weight_grad = [e for e in backward if e[3] == "grad" and e[2] == 16 * 32 * 4]
    assert [e[5] for e in first_weight_grad] == ["model.0"]


def test_gradient_accumulation_keeps_one_step(tmp_path):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "t.events"
    with vramscope_trace.record(path, model=model, optimizer=optimizer):
        for _ in range(2):
            model(torch.randn(4, 16)).sum().backward()
        optimizer.step()
    phases = [e[1:] for e in events_of(path) if e[0] == "p"]
    assert phases == [(1, "forward"), (1, "backward"), (1, "forward"), (1, "backward"),
                      (1, "optimizer")]


def test_without_a_model_the_first_top_level_module_is_the_model(tmp_path):
    model = mlp()
    path = tmp_path / "t.events"
    with vramscope_trace.record(path):
        model(torch.randn(4, 16)).sum().backward()
        model(torch.randn(4, 16)).sum().backward()
    phases = [e[1:] for e in events_of(path) if e[0] == "p"]
    assert phases == [(1, "forward"), (1, "backward"), (2, "forward"), (2, "backward")]


def test_resize_is_a_new_allocation_and_a_free(tmp_path):
    path = tmp_path / "t.events"
    with vramscope_trace.record(path):
        x = torch.empty(4)
        x.resize_(1000)
        out = torch.empty(0)
        torch.add(torch.ones(10), 1, out=out)
    events = [e[:3] for e in events_of(path)]
    assert events[:3] == [("a", 1, 16), ("a", 2, 4000), ("f", 1)]
    assert ("a", 4, 40) in events  # the out= tensor got its bytes from aten::add


def test_only_the_chosen_device_is_recorded(tmp_path):
    path = tmp_path / "t.events"
    with vramscope_trace.record(path, device="meta"):
        torch.randn(100)  # CPU: not recorded
        torch.empty(7, device="meta")
    assert [e[2] for e in allocs(events_of(path))] == [28]


def test_the_file_is_written_when_the_block_raises(tmp_path):
    path = tmp_path / "t.events"
    with pytest.raises(RuntimeError, match="boom"):
        with vramscope_trace.record(path):
            torch.randn(10)
            raise RuntimeError("boom")
    assert [e[2] for e in allocs(events_of(path))] == [40]


def test_empty_cache_is_recorded(tmp_path):
    path = tmp_path / "t.events"
    with vramscope_trace.record(path):
        torch.cuda.empty_cache()
    assert events_of(path) == [("e",)]


def test_everything_is_restored_afterwards(tmp_path):
    from torch.nn.modules import module as module_module
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = (len(module_module._global_forward_pre_hooks), len(module_module._global_forward_hooks),
              torch.cuda.empty_cache, dict(optimizer.__dict__))
    vramscope_trace.record_step(model, (torch.randn(2, 16), None), lambda out, _: out.sum(),
                                optimizer, steps=1, path=tmp_path / "t.events")
    after = (len(module_module._global_forward_pre_hooks), len(module_module._global_forward_hooks),
             torch.cuda.empty_cache, dict(optimizer.__dict__))
    assert before[:3] == after[:3]
    assert before[3].keys() == after[3].keys()
    assert _get_current_dispatch_mode() is None
    # Backward of a graph made during recording, run after it, is harmless.
    with vramscope_trace.record(tmp_path / "u.events", model=model):
        loss = model(torch.randn(2, 16)).sum()
    loss.backward()


def test_a_recorder_records_once(tmp_path):
    recorder = vramscope_trace.Recorder(tmp_path / "t.events")
    with recorder:
        torch.randn(3)
    assert recorder.result.num_allocations == 1
    with pytest.raises(RuntimeError):
        recorder.start()
