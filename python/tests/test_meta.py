"""Recording without memory: the meta device and FakeTensorMode."""

import pytest
import torch

import vramscope_trace
from event_stream_check import check_file
from vramscope_trace import _torch_compat, reference_models


def big_events(path):
    """(kind, bytes, category) of allocations of >= 1 KiB and their frees, in file order."""
    check_file(path)
    sizes, out = {}, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            tokens = line.split()
            if tokens[0] == "a" and int(tokens[2]) >= 1024:
                sizes[tokens[1]] = int(tokens[2])
                out.append(("a", int(tokens[2]), tokens[3]))
            elif tokens[0] == "f" and tokens[1] in sizes:
                out.append(("f", sizes.pop(tokens[1])))
            elif tokens[0] == "p":
                out.append(("p", int(tokens[1]), tokens[2]))
    return out


def test_meta_storages_have_a_size():
    tensor = torch.empty(10, 3, device="meta")
    storage = _torch_compat.untyped_storage(tensor)
    assert storage.nbytes() == 120
    assert _torch_compat.storage_id(tensor[1:]) == _torch_compat.storage_id(tensor)


def test_a_meta_recording_equals_the_cpu_recording(tmp_path):
    results = {}
    for device in ("cpu", "meta"):
        model, batch, loss_fn, optimizer = reference_models.build("llama-tiny", device)
        path = tmp_path / f"{device}.events"
        results[device] = vramscope_trace.record_step(model, batch, loss_fn, optimizer, steps=2,
                                                      path=path)
    assert big_events(tmp_path / "cpu.events") == big_events(tmp_path / "meta.events")
    # The CPU run also records what a GPU run keeps on the host: AdamW's step counters
    # (4 bytes per parameter) and torch 1.13's record_function handles.
    difference = results["cpu"].peak_live_bytes - results["meta"].peak_live_bytes
    num_params = len(list(model.parameters()))
    assert 0 <= difference <= 4 * num_params + 292
    assert (results["cpu"].peak_step, results["cpu"].peak_phase) == (
        results["meta"].peak_step, results["meta"].peak_phase)


def test_fake_tensor_mode_records_forward_and_backward(tmp_path):
    from torch._subclasses import FakeTensorMode

    model, batch, loss_fn, _ = reference_models.build("llama-tiny", "meta")
    meta = vramscope_trace.record_step(model, batch, loss_fn, None, steps=1,
                                       path=tmp_path / "meta.events")
    with FakeTensorMode():
        torch.manual_seed(0)
        model = reference_models.Llama(vocab=256, dim=64, layers=2, heads=4, hidden=172)
        tokens = torch.randint(0, 256, (2, 33))
        batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
        # No optimizer: torch's optimizers do not run under FakeTensorMode (1.13 fails in
        # zero_grad's record_function, 2.x in Adam's step_t.item()).
        fake = vramscope_trace.record_step(model, batch, loss_fn, None, steps=1,
                                           path=tmp_path / "fake.events")
    check_file(tmp_path / "fake.events")
    assert abs(fake.peak_live_bytes - meta.peak_live_bytes) <= 64
    assert big_events(tmp_path / "fake.events") == big_events(tmp_path / "meta.events")


@pytest.mark.skipif(_torch_compat.TORCH_VERSION >= (2, 0),
                    reason="torch 1.13 limitation only: foreach kernels have no meta version")
def test_foreach_optimizers_do_not_run_on_meta_in_torch_1_13(tmp_path):
    model, batch, loss_fn, _ = reference_models.build("llama-tiny", "meta")
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    with pytest.raises(NotImplementedError):
        vramscope_trace.record_step(model, batch, loss_fn, optimizer, steps=1,
                                    path=tmp_path / "t.events")


def test_the_recording_cost_script_runs(tmp_path, capsys):
    from vramscope_trace import measure_cost

    out = tmp_path / "llama.events"
    assert measure_cost.main(["--steps", "1", "--seq", "16", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "6.74e9 parameters" in printed and "bytes/event" in printed
    checked = check_file(out)
    assert out.stat().st_size / checked.events <= 100
