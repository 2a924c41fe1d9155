"""Facts about real PyTorch that the lowering's rules rest on, checked with the installed
torch and transformers (CI runs this under .venv/tf5, torch 2.13 CPU).

Each test states one behaviour of the library, not of vramscope: when a torch release
changes it, the test fails and names the rule in src/lower that must follow.
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

VOCAB, HIDDEN = 4096, 128


class PassThrough(TorchDispatchMode):
    """A dispatch mode that changes nothing, as the trace recorder's does."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def tied_embedding_accumulations(autocast, under_mode):
    """The aten ops that sum the two gradients of a tied [vocab, hidden] weight."""
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=256,
                                   num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model.config.use_cache = False
    model.train()
    ids = torch.randint(0, VOCAB, (1, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        if under_mode:
            with PassThrough():
                loss.backward()
        else:
            loss.backward()
    return [e.name for e in prof.events()
            if e.name in ("aten::add", "aten::add_") and e.input_shapes
            and list(e.input_shapes[0]) == [VOCAB, HIDDEN]]


def test_tied_weight_gradients_are_summed_in_place_under_autocast():
    # The head's gradient reaches the weight through ToCopyBackward0 (a fresh fp32
    # copy) and the embedding's is added into it: autograd/input_buffer.cpp
    # accumulate(). Rule: Graph::Deliver, Tensor::from_cast (src/lower/autograd.cc).
    assert tied_embedding_accumulations(autocast=True, under_mode=False) == ["aten::add_"]


def test_tied_weight_gradients_are_summed_out_of_place_without_autocast():
    # In one precision the head's gradient arrives as TBackward0's view: out of place.
    assert tied_embedding_accumulations(autocast=False, under_mode=False) == ["aten::add"]


def test_a_dispatch_mode_makes_the_sum_out_of_place():
    # What the trace recorder (a TorchDispatchMode) sees differs from the plain run
    # here: Graph::under_dispatch_mode, set with --device-rules cpu for the fidelity grid.
    assert "aten::add" in tied_embedding_accumulations(autocast=True, under_mode=True)


def _backward_output_shapes(make):
    """Shapes of the tensors each aten op returns while backward runs, in order."""
    keep = {"aten::mm", "aten::bmm", "aten::addmm"}
    out = make()
    shapes = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            name = func.name().split(".")[0]
            if isinstance(result, torch.Tensor) and name in keep:
                shapes.append((name, tuple(result.shape)))
            return result

    with Record():
        out.sum().backward()
    return shapes


def test_matmul_gradients_come_in_alphabetical_argument_order():
    # The generated backward computes input gradients in the alphabetical order of the
    # argument names: mm / bmm (self, mat2) make mat2's first, addmm (self, mat1, mat2)
    # mat1's. Rules: Graph::Gemm(second_input_first), BaseLinear and Bmm (src/lower).
    x = torch.randn(6, 5, requires_grad=True)
    w = torch.randn(7, 5, requires_grad=True)
    b = torch.randn(7, requires_grad=True)
    assert _backward_output_shapes(lambda: x @ w.t()) == [("aten::mm", (7, 5)), ("aten::mm", (6, 5))]
    assert _backward_output_shapes(lambda: torch.nn.functional.linear(x, w, b)) == [
        ("aten::mm", (6, 5)), ("aten::mm", (7, 5))]
    q = torch.randn(3, 4, 6, requires_grad=True)
    k = torch.randn(3, 6, 2, requires_grad=True)
    assert _backward_output_shapes(lambda: torch.bmm(q, k)) == [
        ("aten::bmm", (3, 6, 2)), ("aten::bmm", (3, 4, 6))]


def test_safe_softmax_makes_a_bool_mask_as_scratch():
    # at::_safe_softmax (SDPA's math path): the softmax output, then a bool of the
    # scores' size (isneginf) and all()'s small one, freed before it returns; no second
    # full-size output. Rule: SafeSoftmaxScratch (src/lower/attention.cc).
    x = torch.randn(4, 256, 256)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        torch.ops.aten._safe_softmax(x, -1)
    allocated = {e.name: e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0}
    assert allocated["aten::softmax"] == x.numel() * 4
    assert allocated["aten::isneginf"] == x.numel()  # one byte per score
    assert allocated["aten::all"] == x.numel() // 256
    assert "aten::where" not in allocated


def test_autocast_casts_a_calls_arguments_right_to_left():
    # The autocast wrapper's cached_cast calls are arguments of one C++ call, which GCC
    # evaluates right to left: linear casts bias, weight, input; addmm mat2, mat1, self.
    # Rule: BaseLinear's cast order (src/lower/ops.cc).
    x = torch.randn(64, 32)
    w = torch.randn(48, 32, requires_grad=True)
    b = torch.randn(48, requires_grad=True)

    def cast_shapes(call):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    record_shapes=True) as prof:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                call()
        return [tuple(e.input_shapes[0]) for e in prof.events() if e.name == "aten::_to_copy"]

    assert cast_shapes(lambda: torch.nn.functional.linear(x, w, b)) == [(48,), (48, 32), (64, 32)]
    assert cast_shapes(lambda: torch.addmm(b, x, w.t())) == [(32, 48), (64, 32), (48,)]


def _accumulation_ops(through_linear):
    """aten add ops that sum the two gradients a shared [64, 32] input receives."""
    x = torch.randn(64, 32, requires_grad=True)
    h = x * 1.0
    if through_linear:  # two linears on a 3-D view, as q/k/v or gate/up read a norm's output
        h3 = h.view(4, 16, 32)
        a = torch.nn.functional.linear(h3, torch.randn(16, 32))
        b = torch.nn.functional.linear(h3, torch.randn(16, 32))
    else:
        a, b = h.exp(), h.sin()
    loss = a.sum() + b.sum()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        loss.backward()
    return [e.name for e in prof.events() if e.name in ("aten::add", "aten::add_")
            and e.input_shapes and len(e.input_shapes[0]) >= 2]


def test_gradients_reaching_an_input_as_views_are_summed_out_of_place():
    # input_buffer.cpp accumulate(): in place only into a buffered gradient autograd
    # holds the last reference to; a linear's input gradient is the folded matmul's,
    # reshaped back: a view whose base stays alive. Rule: GradOut::view, Graph::Deliver.
    assert _accumulation_ops(through_linear=False) == ["aten::add_"]
    assert _accumulation_ops(through_linear=True) == ["aten::add"]


# --- diffusion UNets (src/lower/unet.cc, unet_ops.cc) ---------------------------------

def test_mse_loss_keeps_the_unreduced_buffer_as_its_storage():
    """unet_ops.cc MseLoss: the 0-d mean holds a storage the size of the elementwise loss."""
    pred = torch.randn(2, 4, 8, 8, requires_grad=True)
    loss = torch.nn.functional.mse_loss(pred, torch.randn(2, 4, 8, 8))
    assert loss.dim() == 0
    assert loss.untyped_storage().nbytes() == pred.numel() * 4


def test_group_norm_statistics_are_fp32_only_for_mixed_dtypes():
    """unet_ops.cc GroupNorm: mean and rstd take the input's dtype unless the weight's differs;
    CPU autocast leaves group_norm in the input's dtype (CUDA's fp32 list has it)."""
    x = torch.randn(2, 8, 4, 4).bfloat16()
    w, b = torch.ones(8), torch.zeros(8)
    _, mean, rstd = torch.ops.aten.native_group_norm(x, w, b, 2, 8, 16, 4, 1e-5)
    assert (mean.dtype, rstd.dtype) == (torch.float32, torch.float32)
    _, mean, rstd = torch.ops.aten.native_group_norm(x, w.bfloat16(), b.bfloat16(), 2, 8, 16, 4,
                                                     1e-5)
    assert (mean.dtype, rstd.dtype) == (torch.bfloat16, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.nn.GroupNorm(4, 8)(x).dtype == torch.bfloat16


def test_a_checkpoint_that_saves_nothing_does_not_keep_its_inputs():
    """autograd.cc EndCheckpoint: non-reentrant checkpointing of a region where nothing
    needs a gradient keeps no reference to its input (a frozen UNet resnet under LoRA)."""
    import weakref

    from torch.utils.checkpoint import checkpoint

    layer = torch.nn.Linear(16, 16).requires_grad_(False)
    x = torch.randn(4, 16)
    out = checkpoint(layer, x, use_reentrant=False)
    ref = weakref.ref(x)
    del x
    assert ref() is None
    assert out.grad_fn is None


def test_peft_casts_a_half_input_to_the_adapters_dtype_under_autocast():
    """ops.cc LoraLinear: peft's _cast_input_dtype copies a bf16 input to the fp32
    adapters' dtype even inside torch.autocast, and lora_A's autocast casts it back."""
    peft = pytest.importorskip("peft")
    model = torch.nn.Sequential(torch.nn.Linear(32, 32))
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["0"]))
    x = torch.randn(8, 32).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    record_shapes=True) as prof:
            model(x)
    casts = [e.input_shapes for e in prof.events() if e.name == "aten::_to_copy"]
    # The input [8, 32] is copied twice: to fp32 for the adapters, back to bf16 for lora_A.
    assert sum(1 for shapes in casts if shapes and shapes[0] == [8, 32]) == 2


class _Clones(TorchDispatchMode):
    """Counts aten.clone calls (torch.matmul's reshape copies)."""

    def __init__(self):
        super().__init__()
        self.clones = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.clone.default:
            self.clones += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("batch,copies", [(1, 0), (2, 2)])
def test_matmul_reshapes_one_rows_transposed_heads_as_views(batch, copies):
    # torch.matmul of [b, heads, s, d] operands that are transposed views of a
    # [b, s, heads * d] projection, one of them broadcast over heads (multi-query k):
    # the reshape to [b * heads, s, d] copies them for b > 1 and is a view for b = 1
    # (SDPA's math path, eager attention). Rule: AttnOperand (src/lower/attention.cc).
    from torch.nn.attention import SDPBackend, sdpa_kernel

    x = torch.randn(batch, 64, 4 * 32)
    q = x.view(batch, 64, 4, 32).transpose(1, 2)
    k = torch.randn(batch, 64, 1, 32).transpose(1, 2).expand(batch, 4, 64, 32)
    v = torch.randn(batch, 64, 1, 32).transpose(1, 2).expand(batch, 4, 64, 32)
    mode = _Clones()
    with sdpa_kernel(SDPBackend.MATH), mode:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert mode.clones == copies


class OpLog(TorchDispatchMode):
    """Records each aten op that runs with the shape of its (first) result."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) else out
        self.ops.append((func.__name__, tuple(first.shape)))
        return out


def _backward_ops(last):
    """The ops the backward of a non-reentrant checkpoint of `last(gelu(x @ w))` runs,
    x [4, 8], w [8, 8]; `last` is `h @ w2` with w2 [8, 5] (a [4, 5] result) or exp."""
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    w2 = torch.randn(8, 5, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)

    def region(t):
        h = torch.nn.functional.gelu(t @ w)
        return h @ w2 if last == "mm" else torch.exp(h)

    y = torch.utils.checkpoint.checkpoint(region, x, use_reentrant=False)
    with OpLog() as log:
        y.sum().backward()
    return log.ops


def test_checkpoint_recompute_stops_before_an_op_whose_inputs_are_the_last_saves():
    """src/lower/autograd.cc Graph::Save (PackPosition): the last mm saves its inputs (h,
    w2) before its kernel runs, so the early-stopping recompute packs them and stops: the
    backward runs the first mm and gelu again, never a [4, 5] mm."""
    ops = _backward_ops("mm")
    assert ("mm.default", (4, 8)) in ops and ("gelu.default", (4, 8)) in ops
    assert ("mm.default", (4, 5)) not in ops


def test_checkpoint_recompute_runs_an_op_whose_result_is_the_last_save():
    """exp saves its result: the recompute runs it."""
    ops = _backward_ops("exp")
    assert ("exp.default", (4, 8)) in ops


class _Unsaving(torch.autograd.Function):
    """`h @ m` keeping m as a ctx attribute, as bitsandbytes' MatMul4Bit keeps its weight:
    nothing goes through save_for_backward, so its node unpacks nothing."""

    @staticmethod
    def forward(ctx, h, m):
        ctx.m = m
        return h @ m

    @staticmethod
    def backward(ctx, grad):
        return torch.exp(grad) @ ctx.m.t(), None


def _recompute_order(reentrant):
    """Backward of a checkpointed `Unsaving(gelu(x @ w), m)`: whether the region's
    recompute (its first mm) runs before Unsaving's backward (its exp)."""
    torch.manual_seed(0)
    w = torch.randn(8, 16, requires_grad=True)
    m = torch.randn(16, 6)
    x = torch.randn(4, 8, requires_grad=True)

    def region(t):
        return _Unsaving.apply(torch.nn.functional.gelu(t @ w), m)

    y = torch.utils.checkpoint.checkpoint(region, x, use_reentrant=reentrant)
    with OpLog() as log:
        y.sum().backward()
    # The region's first mm comes again in the recompute; _Unsaving's backward runs exp
    # and then an mm of the same shape.
    return log.ops.index(("mm.default", (4, 16))) < log.ops.index(("exp.default", (4, 6)))


def test_reentrant_checkpoint_recomputes_before_a_node_that_saved_nothing():
    """src/lower/autograd.cc Graph::RunNode: reentrant checkpointing recomputes the region
    before any of its nodes runs; non-reentrant at the first unpack, after the backward of a
    last op that saved nothing (QLoRA's 4-bit linears)."""
    assert _recompute_order(reentrant=True)
    assert not _recompute_order(reentrant=False)


def test_the_recorder_sees_inside_bitsandbytes_ops(tmp_path, monkeypatch):
    """python/vramscope/trace/_modes.py: bitsandbytes' gemm_4bit (0.50.2) dequantizes the
    whole weight inside one custom op; the recorder runs its kernel under its own mode, so
    that temporary (out_features x in_features in the compute dtype) reaches the trace of a
    forward (backward's dequantize_4bit returns it: seen either way)."""
    bnb = pytest.importorskip("bitsandbytes")
    import vramscope.trace as trace
    from vramscope.trace import _modes

    out_features, in_features = 256, 512
    layer = bnb.nn.Linear4bit(in_features, out_features, bias=False,
                              compute_dtype=torch.bfloat16, quant_type="nf4")
    weight = bnb.nn.Params4bit(torch.randn(out_features, in_features, dtype=torch.bfloat16),
                               requires_grad=False, quant_type="nf4")
    layer.weight = weight._quantize("cpu")
    layer.train()
    x = torch.randn(2, in_features, dtype=torch.bfloat16)

    def peak(path):
        with trace.record(str(path), inputs=[x]) as rec:
            layer(x)
        return rec.result.peak_live_bytes

    seen = peak(tmp_path / "seen.events")
    monkeypatch.setattr(_modes, "_TRANSPARENT_NAMESPACES", frozenset())
    opaque = peak(tmp_path / "opaque.events")
    assert seen - opaque >= out_features * in_features * 2
