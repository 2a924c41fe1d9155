"""The measured loop and the record it fills, driven on CPU with a fake probe."""

from types import SimpleNamespace

import pytest

from gtlib import knobs, loop, schema, worker

torch = pytest.importorskip("torch")
F = torch.nn.functional


class FakeOOM(RuntimeError):
    pass


class FakeProbe:
    """Counts bytes as the test tells it to; records the calls made."""

    def __init__(self):
        self.calls = []
        self.current = 1000
        self.peak = 1000

    def sync(self):
        self.calls.append("sync")

    def reset_peak(self):
        self.calls.append("reset_peak")
        self.peak = self.current

    def bump(self, nbytes):
        self.current += nbytes
        self.peak = max(self.peak, self.current)

    def allocated(self):
        return self.current

    def reserved(self):
        return self.current + 4096

    def peak_allocated(self):
        return self.peak

    def peak_reserved(self):
        return self.peak + 4096

    def device_used(self):
        return self.current + 8192

    def device_total(self):
        return 1 << 40

    def stats(self):
        return {"num_alloc_retries": 2, "num_ooms": 0, "allocated_bytes.all.peak": self.peak,
                "unrelated.key": 5}

    def is_oom(self, exc):
        return isinstance(exc, FakeOOM)


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=50, hidden=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)
        self.vocab = vocab

    def forward(self, input_ids, labels):
        logits = self.lm_head(self.embed(input_ids))
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, self.vocab), labels[:, 1:].reshape(-1))
        return SimpleNamespace(loss=loss, logits=logits)


def test_train_records_every_phase_in_order():
    model = TinyLM()
    probe = FakeProbe()
    recorder = loop.PhaseRecorder(probe)
    ids = torch.randint(0, 50, (2, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loop.train(model, opt, loop.hf_loss_fn(model, ids, ids), recorder, steps=2, micro_batches=3)
    names = [(p["step"], p["micro_batch"], p["phase"]) for p in recorder.phases]
    assert names[:7] == [(1, 0, "forward"), (1, 0, "backward"), (1, 1, "forward"),
                         (1, 1, "backward"), (1, 2, "forward"), (1, 2, "backward"),
                         (1, None, "optimizer")]
    assert len(names) == 14
    assert all(p["completed"] for p in recorder.phases)
    # Peaks are reset (after a sync) at every phase start.
    assert probe.calls.count("reset_peak") == 14
    assert probe.calls[:2] == ["sync", "reset_peak"]
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none=True)


def test_train_without_optimizer_clears_grads():
    model = TinyLM()
    recorder = loop.PhaseRecorder(FakeProbe())
    ids = torch.randint(0, 50, (1, 4))
    loop.train(model, None, loop.hf_loss_fn(model, ids, ids), recorder, steps=1, micro_batches=1)
    assert [p["phase"] for p in recorder.phases] == ["forward", "backward"]
    assert all(p.grad is None for p in model.parameters())


class CaptureOptimizer:
    """Stands in for an optimizer: keeps the gradients it is asked to apply."""

    def __init__(self, params):
        self.params = list(params)
        self.grads = None

    def step(self):
        self.grads = [p.grad.clone() for p in self.params]

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


def test_grad_accum_divides_the_loss():
    torch.manual_seed(0)
    model = TinyLM()
    ids = torch.randint(0, 50, (2, 8))
    loss_fn = loop.hf_loss_fn(model, ids, ids)
    loss_fn().backward()
    single = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    opt = CaptureOptimizer(model.parameters())
    # Three micro-batches of the same batch, each loss / 3: the same gradients as one.
    loop.train(model, opt, loss_fn, loop.PhaseRecorder(FakeProbe()), steps=1, micro_batches=3)
    for want, got in zip(single, opt.grads):
        assert torch.allclose(want, got, atol=1e-6)


class Backbone(torch.nn.Module):
    def __init__(self, vocab=40, hidden=8):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.proj = torch.nn.Linear(hidden, hidden)

    def forward(self, input_ids):
        return SimpleNamespace(last_hidden_state=torch.tanh(self.proj(self.embed(input_ids))))


@pytest.mark.parametrize("chunk, softcap", [(3, None), (5, 2.0), (8, None), (20, None)])
def test_chunked_loss_equals_full_loss_and_gradients(chunk, softcap):
    torch.manual_seed(0)
    backbone, head = Backbone(), torch.nn.Linear(8, 40, bias=False)
    ids = torch.randint(0, 40, (2, 7))
    loss = loop.chunked_causal_loss_fn(torch, backbone, head, ids, ids, chunk, softcap)()
    loss.backward()
    got = [p.grad.clone() for p in list(backbone.parameters()) + list(head.parameters())]
    for p in list(backbone.parameters()) + list(head.parameters()):
        p.grad = None
    logits = head(backbone(ids).last_hidden_state)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    shifted = F.pad(ids, (0, 1), value=-100)[:, 1:]
    ref = F.cross_entropy(logits.float().reshape(-1, 40), shifted.reshape(-1), ignore_index=-100)
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-6)
    want = [p.grad for p in list(backbone.parameters()) + list(head.parameters())]
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-6)


def new_record():
    k = knobs.normalize_knobs({"model": "tiny", "seq": 8, "batch": 2, "steps": 2})
    env = {"python_version": "3", "packages": {}, "gpu_present": True}  # pretend
    rec = schema.new_record(knobs.config_id(k), knobs.config_name(k), k, None, env, "cmd", {})
    rec["plan"] = {"plan_version": 1}
    return rec


def run_measure(fail_at=None, fail_with=FakeOOM, steps=2):
    probe = FakeProbe()
    rec = new_record()
    state = {}
    calls = {"forward": 0}

    def setup():
        if fail_at == "setup":
            probe.bump(10**6)
            raise fail_with("CUDA out of memory while building")
        model = TinyLM()
        probe.bump(5000)  # "weights"
        rec["model"] = {"alias": "tiny", "hub_id": None, "source": "test", "model_type": "llama",
                        "architecture": "TinyLM", "parameters": 1600, "trainable_parameters": 1600,
                        "parameter_bytes_by_dtype": {"float32": 6400}, "lora_modules": None,
                        "applied": {}}
        ids = torch.randint(0, 50, (2, 8))
        base = loop.hf_loss_fn(model, ids, ids)

        def compute():
            calls["forward"] += 1
            probe.bump(300)
            if fail_at == "forward2" and calls["forward"] == 2:
                raise fail_with("CUDA out of memory. Tried to allocate 20.00 GiB")
            return base()
        state.update(model=model, opt=torch.optim.SGD(model.parameters(), lr=0.1),
                     compute=compute)

    def steps_fn(recorder, hooks):
        loop.train(state["model"], state["opt"], state["compute"], recorder, steps, 1,
                   hooks=hooks)

    worker.measure_with(probe, rec, setup, steps_fn, context_bytes=512, smi=lambda pid: 777)
    return rec


def test_measure_with_ok_record_is_valid():
    rec = run_measure()
    assert rec["status"] == "ok"
    assert schema.validate_result(rec) == []
    mem = rec["memory"]
    assert mem["cuda_context_bytes"] == 512
    assert mem["before_model"]["allocated_bytes"] == 1000
    assert mem["setup"]["allocated_bytes"] == 6000
    assert mem["peak_allocated_bytes"] == max(p["peak_allocated_bytes"] for p in rec["phases"])
    assert mem["num_alloc_retries"] == 2
    assert "unrelated.key" not in mem["allocator_stats"]
    assert mem["nvidia_smi_process_bytes"] == 777
    assert len(rec["phases"]) == 6


def test_measure_with_oom_in_step_two():
    rec = run_measure(fail_at="forward2")
    assert rec["status"] == "oom" and rec["oom"] is True
    assert rec["oom_at"] == {"step": 2, "micro_batch": 0, "phase": "forward"}
    assert "Tried to allocate" in rec["reason"]
    assert rec["phases"][-1]["completed"] is False
    assert schema.validate_result(rec) == []


def test_measure_with_oom_in_setup():
    rec = run_measure(fail_at="setup")
    assert rec["status"] == "oom"
    assert rec["oom_at"] == {"step": 0, "micro_batch": None, "phase": "setup"}
    assert rec["memory"]["setup"]["peak_allocated_bytes"] >= 10**6
    assert rec["phases"] == []
    assert schema.validate_result(rec) == []


def test_other_errors_propagate_with_partial_readings():
    rec = new_record()
    probe = FakeProbe()
    with pytest.raises(ValueError):
        worker.measure_with(probe, rec, lambda: None,
                            lambda recorder, hooks: (recorder.begin(1, 0, "forward"),
                                                     (_ for _ in ()).throw(ValueError("bug"))))
    assert rec["phases"][0]["completed"] is False


def test_is_oom_error():
    assert loop.is_oom_error(torch, RuntimeError("CUDA out of memory. Tried to allocate"))
    assert not loop.is_oom_error(torch, RuntimeError("shape mismatch"))
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None:
        assert loop.is_oom_error(torch, oom_type("x"))


def test_dtype_kwarg_by_transformers_version():
    assert worker.dtype_kwarg("4.46.3") == "torch_dtype"
    assert worker.dtype_kwarg("4.56.0") == "dtype"
    assert worker.dtype_kwarg("5.17.0") == "dtype"
    assert worker.dtype_kwarg("") == "torch_dtype"


def test_allocator_stats_selects_known_keys():
    got = loop.allocator_stats({"num_ooms": 1, "x": 2, "segment.all.peak": 3})
    assert got == {"num_ooms": 1, "segment.all.peak": 3}
