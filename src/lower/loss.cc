#include "loss.h"

#include <algorithm>
#include <vector>

#include "int_math.h"
#include "ops.h"
#include "unet_ops.h"

namespace vramscope::lower {
namespace {

Var Softcap(Tape& tape, const Var& logits) {
  // gemma2: logits / cap -> tanh (saves its result) -> * cap
  Var a = Scale(tape, logits);
  Var t = tape.New(a.numel, a.elem_bytes, Category::kLoss, "aten::tanh");
  if (a.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("TanhBackward0", &t);
    tape.graph.Save(n, t.t);
    tape.graph.Edge(n, a, a.bytes());
  }
  tape.Drop(a);
  Var out = Scale(tape, t);
  tape.Drop(t);
  return out;
}

Var HfLoss(Tape& tape, const TrainingSetup& setup, const Var& hidden, Param& head, Param* head_bias,
           uint64_t tokens, uint64_t vocab, double softcap) {
  Var logits = Linear(tape, hidden, head, head_bias, tokens, vocab);
  // What follows the head runs in the CausalLM's own forward (the loss
  // function it calls), not in lm_head: the recorder tags it with the model,
  // and a sharding library's pre-backward hook on lm_head's output fires only
  // once these ops' backward is done.
  tape.SetModule("model");
  if (softcap > 0) {
    Var capped = Softcap(tape, logits);
    tape.Drop(logits);
    logits = capped;
  }
  const uint64_t batch = std::max<uint64_t>(1, setup.batch);
  const uint64_t shifted = (tokens - std::min(tokens, batch)) * vocab;
  if (setup.transformers_version <= 445) {
    // <= 4.45: `logits = logits.float()` in the model forward, then
    // shift_logits = logits[..., :-1, :].contiguous() in the model's loss code.
    Var l32 = Cast(tape, logits, kF32);
    tape.Drop(logits);
    Var shift = tape.New(shifted, kF32, Category::kLoss, "aten::clone");
    if (l32.requires_grad() && tape.grad_enabled) {
      NodeId n = tape.Node("SliceBackward0", &shift);
      tape.graph.Edge(n, l32, l32.bytes(), Category::kLoss);
    }
    Var loss = CrossEntropyLoss(tape, shift);
    tape.Drop(shift);
    tape.Drop(l32);  // outputs.logits: dropped by a loop that keeps only the loss
    return loss;
  }
  // >= 4.46: the model returns logits in the compute dtype; ForCausalLMLoss
  // upcasts (`logits = logits.float()`).
  Var l32 = Cast(tape, logits, kF32);
  Var loss;
  if (setup.transformers_version <= 448) {
    // 4.46-4.48: shift_logits = logits[..., :-1, :].contiguous()
    Var shift = tape.New(shifted, kF32, Category::kLoss, "aten::clone");
    if (l32.requires_grad() && tape.grad_enabled) {
      NodeId n = tape.Node("SliceBackward0", &shift);
      tape.graph.Edge(n, l32, l32.bytes(), Category::kLoss);
    }
    loss = CrossEntropyLoss(tape, shift);
    tape.Drop(shift);
  } else {
    // >= 4.49 (PR #35646): labels are padded instead; no shifted copy.
    Var padded = tape.New(tokens + batch, kI64, Category::kOther, "aten::constant_pad_nd");
    Var shift_labels = tape.New(tokens, kI64, Category::kOther, "aten::clone");
    tape.Drop(padded);
    loss = CrossEntropyLoss(tape, l32);
    tape.Drop(shift_labels);
  }
  tape.Drop(l32);
  tape.Drop(logits);  // outputs.logits: dropped by a loop that keeps only the loss
  return loss;
}

// Chunked cross-entropy: the hidden states are split into 8 chunks, each
// projected, upcast and reduced in turn; a chunk's half logits stay alive
// through its own cross_entropy (`part = F.cross_entropy(logits.float(), ...)`;
// `del logits`, as the ground-truth harness's loop.py does: measured on the
// H100, Qwen2.5-0.5B at 8k tokens). torchtune's CEWithChunkedOutputLoss keeps
// every chunk's logits from the model's forward instead.
Var ChunkedLoss(Tape& tape, const Var& hidden, Param& head, uint64_t tokens, uint64_t hidden_size,
                uint64_t vocab) {
  const uint64_t chunks = std::min<uint64_t>(8, std::max<uint64_t>(1, tokens));
  Var total;
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t ct = tokens / chunks + (c < tokens % chunks ? 1 : 0);
    Var hc = tape.Share(hidden);
    hc.numel = ct * hidden_size;
    Var logits = Linear(tape, hc, head, nullptr, ct, vocab);
    tape.Drop(hc);
    Var l32 = Cast(tape, logits, kF32);
    Var part = CrossEntropyLoss(tape, l32);
    tape.Drop(l32);
    tape.Drop(logits);
    if (total.t == kNoTensor) {
      total = part;
    } else {
      Var sum = Add(tape, total, part);
      tape.Drop(total);
      tape.Drop(part);
      total = sum;
    }
  }
  return total;
}

// Fused linear cross-entropy (Liger-Kernel LigerFusedLinearCrossEntropyFunction):
// gradients of the input and of the weight are computed during forward, chunk
// by chunk, and saved; no [tokens, vocab] tensor is ever whole.
Var FusedLinearLoss(Tape& tape, const Var& hidden, Param& head, uint64_t tokens,
                    uint64_t hidden_size, uint64_t vocab) {
  const uint64_t inc = CeilDiv(vocab, hidden_size);
  uint64_t chunk = 1;
  while (chunk < CeilDiv(tokens, inc)) chunk <<= 1;
  chunk = std::min(chunk, tokens);
  Var grad_input =
      tape.New(tokens * hidden_size, hidden.elem_bytes, Category::kLoss, "liger::grad_input");
  Var grad_weight = tape.New(head.numel, head.elem_bytes, Category::kLoss, "liger::grad_weight");
  Var logits = tape.New(chunk * vocab, hidden.elem_bytes, Category::kLoss, "liger::logits_chunk");
  Var work = tape.New(chunk * vocab, kF32, Category::kLoss, "liger::cross_entropy");
  tape.Drop(work);
  tape.Drop(logits);
  Var loss = tape.New(1, kF32, Category::kLoss, "liger::loss");
  if (tape.grad_enabled) {
    NodeId n = tape.Node("LigerFusedLinearCrossEntropyFunctionBackward", &loss);
    tape.graph.Save(n, grad_input.t);
    tape.graph.Save(n, grad_weight.t);
    tape.graph.Edge(n, hidden, hidden.bytes());
    tape.graph.Edge(n, head.var, head.numel * head.elem_bytes);
  }
  tape.Drop(grad_input);
  tape.Drop(grad_weight);
  return loss;
}

// log_softmax in the logits' dtype; LogSoftmaxBackward0 saves its result.
Var LogSoftmaxSavingResult(Tape& tape, const Var& logits) {
  Var lsm = tape.New(logits.numel, logits.elem_bytes, Category::kLoss, "aten::_log_softmax");
  if (logits.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("LogSoftmaxBackward0", &lsm);
    tape.graph.Save(n, lsm.t);
    tape.graph.Edge(n, logits, logits.bytes());
  }
  return lsm;
}

}  // namespace

// torchtune 0.6.1 (loss.h): TransformerDecoder.chunked_output projects each of 8
// chunks of the final hidden states (`[self.output(chunk) for chunk in
// last_hidden_state.tensor_split(8, dim=1)]`, modules/transformer.py): every
// chunk's logits, in the model's dtype, exist together. The recipe shifts the
// labels (`torch.hstack((labels[..., 1:], ignore_labels_cache))`,
// recipes/full_finetune_single_device.py _loss_step) and CEWithChunkedOutputLoss
// (modules/loss/ce_chunked_output_loss.py) counts the labelled tokens, then per
// chunk `F.cross_entropy(logits.float(), labels, reduction="sum")`: the fp32
// copy goes after its log_softmax, whose fp32 output is saved. `del logits`
// after the loss frees the logits before backward.
Var TorchtuneChunkedLoss(Tape& tape, Var* hidden_owner, Param& head, uint64_t tokens,
                         uint64_t hidden_size, uint64_t vocab) {
  const Var hidden = *hidden_owner;
  constexpr uint64_t kChunks = 8;  // CEWithChunkedOutputLoss(num_output_chunks=8)
  const uint64_t chunks = std::min<uint64_t>(kChunks, std::max<uint64_t>(1, tokens));
  std::vector<Var> logits;
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t ct = tokens / chunks + (c < tokens % chunks ? 1 : 0);
    Var hc = tape.Share(hidden);
    hc.numel = ct * hidden_size;
    logits.push_back(Linear(tape, hc, head, nullptr, ct, vocab));
    tape.Drop(hc);
  }
  // TransformerDecoder.forward returns the list: its local `h` goes.
  tape.Drop(*hidden_owner);
  Var labels = tape.New(tokens, kI64, Category::kOther, "aten::hstack");
  Var labelled = tape.New(tokens, kBool, Category::kTemporaries, "aten::ne");
  Var count = tape.New(1, kI64, Category::kLoss, "aten::sum");
  tape.Drop(labelled);
  Var total;
  for (Var& chunk : logits) {
    Var l32 = Cast(tape, chunk, kF32);
    Var part = CrossEntropyLoss(tape, l32);
    tape.Drop(l32);
    if (total.t == kNoTensor) {
      total = part;
    } else {
      Var sum = Add(tape, total, part);
      tape.Drop(total);
      tape.Drop(part);
      total = sum;
    }
  }
  Var loss = tape.New(1, kF32, Category::kLoss, "aten::div");
  if (tape.grad_enabled && total.requires_grad()) {
    NodeId n = tape.Node("DivBackward0", &loss);
    tape.graph.Edge(n, total, total.bytes(), Category::kLoss);
  }
  tape.Drop(total);
  tape.Drop(count);
  tape.Drop(labels);
  for (Var& chunk : logits) tape.Drop(chunk);  // `del logits`
  return loss;
}

namespace {

// GPT.forward with lm_head_chunk_size=128 (litgpt/model.py 0.5.13):
// `[self.lm_head(x_i) for x_i in x.split(128, dim=1)]`. A split of a batch
// of more rows is not contiguous: F.linear folds it with a reshape, a copy
// that MmBackward0 saves (matmul folds inputs that require grad); under
// autocast the input's cast is that contiguous copy instead.
std::vector<Var> LitgptLogitChunks(Tape& tape, const Var& hidden, Param& head, uint64_t batch,
                                   uint64_t seq, uint64_t hidden_size, uint64_t vocab) {
  std::vector<Var> chunks;
  for (uint64_t start = 0; start < seq; start += kLitgptChunkTokens) {
    const uint64_t rows = batch * std::min(kLitgptChunkTokens, seq - start);
    Var xc = tape.Share(hidden);
    xc.numel = rows * hidden_size;
    const bool strided = batch > 1 && seq > kLitgptChunkTokens;
    const bool cast = tape.autocast && hidden.elem_bytes != tape.compute_bytes;
    if (strided && !cast) {
      Var copy = tape.New(xc.numel, xc.elem_bytes, Category::kTemporaries, "aten::clone");
      if (tape.grad_enabled && xc.requires_grad()) {
        NodeId n = tape.Node("CloneBackward0", &copy);
        tape.graph.Edge(n, xc, hidden.bytes());  // a zero-filled whole, the slice written
      }
      tape.Drop(xc);
      xc = copy;
    }
    chunks.push_back(Linear(tape, xc, head, nullptr, rows, vocab));
    tape.Drop(xc);
  }
  return chunks;
}

// chunked_cross_entropy's per-chunk F.cross_entropy(reduction="none") in the
// logits' own dtype (litgpt/utils.py 0.5.13: no upcast of its own; Fabric's
// output conversion made them fp32); LogSoftmaxBackward0
// saves each chunk's log-probabilities until backward.
Var LitgptChunkLoss(Tape& tape, const Var& chunk, uint64_t vocab) {
  Var lsm = LogSoftmaxSavingResult(tape, chunk);
  const uint64_t rows = chunk.numel / vocab;
  Var loss = tape.New(rows, chunk.elem_bytes, Category::kLoss, "aten::nll_loss_forward");
  if (lsm.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("NllLossBackward0", &loss);
    tape.graph.Edge(n, lsm, lsm.bytes(), Category::kLoss);
  }
  tape.Drop(lsm);
  return loss;
}

}  // namespace

namespace {

// `logits[-1] = logits[-1][..., :-1, :]`, then chunked_cross_entropy's
// `logit_chunk.reshape(-1, V)`: a view, except the last chunk of a batch of
// more rows (the slice is strided), which is copied; the list holds the
// copies until it returns.
std::vector<Var> LitgptLossInputs(Tape& tape, const std::vector<Var>& chunks, uint64_t batch,
                                  uint64_t vocab) {
  std::vector<Var> inputs;
  for (size_t i = 0; i < chunks.size(); ++i) {
    Var in = tape.Share(chunks[i]);
    if (i + 1 == chunks.size()) {
      in.numel = (chunks[i].numel / vocab - batch) * vocab;
      if (batch > 1) {
        Var copy = tape.New(in.numel, in.elem_bytes, Category::kTemporaries, "aten::clone");
        if (tape.grad_enabled && in.requires_grad()) {
          NodeId n = tape.Node("CloneBackward0", &copy);
          tape.graph.Edge(n, in, chunks[i].bytes());
        }
        tape.Drop(in);
        in = copy;
      }
    }
    inputs.push_back(in);
  }
  return inputs;
}

// `torch.cat(loss_chunks).sum() / non_masked_elems.maximum(...)`.
Var LitgptReduce(Tape& tape, std::vector<Var>& parts, uint64_t labels) {
  Var labelled = tape.New(labels, kBool, Category::kTemporaries, "aten::ne");
  Var count = tape.New(1, kI64, Category::kLoss, "aten::sum");
  tape.Drop(labelled);
  uint64_t rows = 0;
  for (const Var& p : parts) rows += p.numel;
  Var cat = tape.New(rows, parts[0].elem_bytes, Category::kLoss, "aten::cat");
  if (tape.grad_enabled) {
    NodeId n = tape.Node("CatBackward0", &cat);
    for (const Var& p : parts) {
      if (p.requires_grad()) tape.graph.Edge(n, p, p.bytes(), Category::kLoss);
    }
  }
  for (Var& p : parts) tape.Drop(p);
  Var sum = tape.New(1, cat.elem_bytes, Category::kLoss, "aten::sum");
  if (tape.grad_enabled && cat.requires_grad()) {
    NodeId n = tape.Node("SumBackward0", &sum);
    tape.graph.Edge(n, cat, cat.bytes(), Category::kLoss);
  }
  tape.Drop(cat);
  Var loss = tape.New(1, sum.elem_bytes, Category::kLoss, "aten::div");
  if (tape.grad_enabled && sum.requires_grad()) {
    NodeId n = tape.Node("DivBackward0", &loss);
    tape.graph.EdgePass(n, sum);
  }
  tape.Drop(sum);
  tape.Drop(count);
  return loss;
}

}  // namespace

// LitGPT's fine-tuning step (finetune/full.py / lora.py fit(), 0.5.13).
Var LitgptChunkedLoss(Tape& tape, Var* hidden_owner, Param& head, uint64_t batch, uint64_t seq,
                      uint64_t hidden_size, uint64_t vocab) {
  std::vector<Var> chunks =
      LitgptLogitChunks(tape, *hidden_owner, head, batch, seq, hidden_size, vocab);
  tape.Drop(*hidden_owner);  // GPT.forward returns: its `x` goes
  // bf16-mixed: its forward_context (torch.autocast) exits first, and with it
  // the autocast cache of weight casts.
  if (tape.autocast) ClearAutocastCache(tape);
  // Fabric's _FabricModule.forward then converts the outputs
  // (precision.convert_output, lightning 2.6.6 fabric/wrappers.py): half
  // logits of bf16-true / bf16-mixed become fp32 copies (the default dtype),
  // one chunk at a time, and the half list goes once all are made.
  if (chunks[0].elem_bytes != kF32) {
    std::vector<Var> converted;
    for (const Var& c : chunks) converted.push_back(Cast(tape, c, kF32));
    for (Var& c : chunks) tape.Drop(c);
    chunks = converted;
  }
  // `logits = model(...)` rebinds the loop's variable: last step's chunks go.
  for (Var& v : tape.loop_logits) tape.Drop(v);
  tape.loop_logits = chunks;
  std::vector<Var> inputs = LitgptLossInputs(tape, chunks, batch, vocab);
  std::vector<Var> parts;
  for (Var& in : inputs) parts.push_back(LitgptChunkLoss(tape, in, vocab));
  Var loss = LitgptReduce(tape, parts, batch * (seq - 1));
  for (Var& in : inputs) tape.Drop(in);
  return loss;
}

// F.cross_entropy = log_softmax (saves its output) + nll_loss (saves the
// target and total_weight). Backward: nll_loss_backward allocates a zeroed
// full-size gradient; _log_softmax_backward_data another.
namespace {

// `last_non_pad_token = (arange(s, int32) * (input_ids != pad).to(int32)).argmax(-1)`:
// the int32 arange and mask stay locals until forward returns; the product goes.
std::vector<Var> LastNonPadToken(Tape& tape, uint64_t batch, uint64_t tokens, Var* last) {
  Var ne = tape.New(tokens, kBool, Category::kTemporaries, "aten::ne");
  Var mask = tape.New(tokens, 4, Category::kTemporaries, "aten::_to_copy");
  tape.Drop(ne);
  Var indices = tape.New(tokens / batch, 4, Category::kTemporaries, "aten::arange");
  Var product = tape.New(tokens, 4, Category::kTemporaries, "aten::mul");
  *last = tape.New(batch, kI64, Category::kTemporaries, "aten::argmax");
  tape.Drop(product);
  return {mask, indices};
}

}  // namespace

Var ClassificationLoss(Tape& tape, const Var& logits, uint64_t labels, const Var& label_values) {
  if (labels != 1 && tape.autocast && !tape.cpu_rules) {
    return CrossEntropyLossHalfCudaAutocast(tape, logits);
  }
  Var l32 = tape.autocast ? Cast(tape, logits, kF32) : tape.Share(logits);
  Var loss = labels == 1 ? MseLoss(tape, l32, label_values) : CrossEntropyLoss(tape, l32);
  tape.Drop(l32);
  return loss;
}

Var SequenceClassificationLoss(Tape& tape, const TrainingSetup& setup, const Var& hidden,
                               Param& score, uint64_t tokens, uint64_t labels,
                               const Var& label_values) {
  const uint64_t batch = std::max<uint64_t>(1, setup.batch);
  Var logits = Linear(tape, hidden, score, nullptr, tokens, labels);
  Var last;
  std::vector<Var> locals = LastNonPadToken(tape, batch, tokens, &last);
  // logits[torch.arange(b), last]: IndexBackward0 keeps both index tensors and
  // scatters the gradient into a zero tensor of the logits' size.
  Var rows = tape.New(batch, kI64, Category::kTemporaries, "aten::arange");
  Var pooled = tape.New(batch * labels, logits.elem_bytes, Category::kLoss, "aten::index");
  if (tape.grad_enabled && logits.requires_grad()) {
    NodeId n = tape.Node("IndexBackward0", &pooled);
    tape.graph.Save(n, rows.t);
    tape.graph.Save(n, last.t);
    tape.graph.Edge(n, logits, logits.bytes(), Category::kLoss);
  }
  tape.Drop(rows);
  // MSELoss()(pooled.squeeze(), labels.squeeze()) or fixed_cross_entropy.
  Var loss = ClassificationLoss(tape, pooled, labels, label_values);
  // The forward returns: its locals (logits, the mask, the indices) go; the
  // returned pooled logits go with the output.
  tape.Drop(logits);
  tape.Drop(last);
  for (Var& v : locals) tape.Drop(v);
  tape.Drop(pooled);
  return loss;
}

Var CrossEntropyLoss(Tape& tape, const Var& logits32) {
  Var lsm = LogSoftmaxSavingResult(tape, logits32);
  Var loss = tape.New(1, kF32, Category::kLoss, "aten::nll_loss_forward");
  if (lsm.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("NllLossBackward0", &loss);
    tape.graph.Edge(n, lsm, lsm.bytes(), Category::kLoss);
  }
  tape.Drop(lsm);
  return loss;
}

// F.cross_entropy on half logits under CUDA autocast. cross_entropy_loss
// (aten/src/ATen/native/LossNLL.cpp, torch 2.x) calls log_softmax(self, dim,
// self.scalar_type()): the dtype is explicit, so autocast's fp32_set_opt_dtype
// policy leaves it half, and LogSoftmaxBackward0 saves the half result. nll_loss
// is on the fp32 list (ATen/autocast_mode.h, torch 2.13): the log-probabilities
// are cast to fp32, and NllLossBackward0 saves that cast (derivatives.yaml:
// nll_loss_backward takes self). Seen on the H100: BERT's masked-LM loss holds
// the half log-probabilities and their fp32 copy until backward.
Var CrossEntropyLossHalfCudaAutocast(Tape& tape, const Var& logits) {
  Var lsm = LogSoftmaxSavingResult(tape, logits);
  Var lsm32 = Cast(tape, lsm, kF32);
  tape.Drop(lsm);
  Var loss = tape.New(1, kF32, Category::kLoss, "aten::nll_loss_forward");
  if (lsm32.requires_grad() && tape.grad_enabled) {
    NodeId n = tape.Node("NllLossBackward0", &loss);
    tape.graph.Save(n, lsm32.t);
    tape.graph.Edge(n, lsm32, lsm32.bytes(), Category::kLoss);
  }
  tape.Drop(lsm32);
  return loss;
}

Var CausalLmLoss(Tape& tape, const TrainingSetup& setup, const Var& hidden, Param& head,
                 Param* head_bias, uint64_t tokens, uint64_t hidden_size, uint64_t vocab,
                 double softcap) {
  switch (setup.loss) {
    case LossKind::kChunked: return ChunkedLoss(tape, hidden, head, tokens, hidden_size, vocab);
    case LossKind::kFusedLinear:
      return FusedLinearLoss(tape, hidden, head, tokens, hidden_size, vocab);
    case LossKind::kTrlFused:
      return TrlFusedLoss(tape, setup, hidden, head, tokens, hidden_size, vocab);
    case LossKind::kTorchtuneChunked: break;  // TorchtuneChunkedLoss, called directly
    case LossKind::kLitgptChunked: break;     // LitgptChunkedLoss, called directly
    case LossKind::kHf: break;
  }
  return HfLoss(tape, setup, hidden, head, head_bias, tokens, vocab, softcap);
}

}  // namespace vramscope::lower
