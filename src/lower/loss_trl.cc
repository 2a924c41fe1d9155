// TRL's fused LM head (trl 1.15-1.16: trl/trainer/utils.py add_fused_lm_head,
// trl/kernels/chunked_logprob.py ChunkedLogProbFunction), which SFTTrainer and
// DPOTrainer patch into the model: the backbone's last hidden state, shifted,
// goes through the LM head in [4096 tokens x 32768 vocabulary] tiles folded
// into online log-sum-exp statistics; the per-token log-probabilities come
// back, never the [tokens, vocab] logits. Backward recomputes every tile and
// accumulates both gradients in fp32.
//
// CUDA (Triton present): only labelled positions are scored
// (`hidden_states[mask]`, the "compact" path) and the Triton kernels allocate
// nothing. Elsewhere (CPU: the fidelity check) every position is scored and
// the tiles are folded with torch ops, whose temporaries are modelled here
// from the code. Every position is assumed labelled (plain language
// modelling; a completion-only loss scores fewer).
#include <algorithm>

#include "int_math.h"
#include "loss.h"
#include "ops.h"

namespace vramscope::lower {
namespace {

constexpr uint64_t kTokenChunk = 4096;   // chunked_logprob.py TOKEN_CHUNK_SIZE
constexpr uint64_t kVocabChunk = 32768;  // trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE
constexpr uint64_t kStatBuffers = 7;     // running_max ... target_logit: fp32 [N] each
// _forward_tile's torch ops hold at most z, before_target (bool), z - m and
// exp(...) or e * z at once: 13 bytes per tile element with is_top1 and
// entropy (SFT), 12 without (DPO's log-probabilities only).
constexpr uint64_t kCpuForwardFoldBytes = 13;
constexpr uint64_t kCpuForwardFoldBytesLogProbs = 12;
// _backward_tile: y, z, log_p, p, grad (fp32), is_target (bool), then
// is_target.float() and its difference with p: 29 bytes per tile element.
constexpr uint64_t kCpuBackwardFoldBytes = 29;

struct Shape {
  uint64_t positions;    // B * (S - 1): shifted positions, all labelled
  uint64_t hidden_size;  // H
  uint64_t vocab;        // V
  uint8_t compute;       // autocast dtype, else the hidden states' dtype
  bool compact;          // CUDA: hidden_states[mask]
  bool cpu;              // torch folds instead of Triton kernels
  bool metrics;          // entropy and is_top1 too (SFT, DPO's policy)
  bool mean_logits;      // DPO's policy: the mean logit too
  uint64_t TileRows() const { return std::min(positions, kTokenChunk); }
  uint64_t TileCols() const { return std::min(vocab, kVocabChunk); }
};

bool Grad(const Tape& tape, const Var& v) { return tape.grad_enabled && v.requires_grad(); }

// hidden_states = last_hidden_state[:, :-1], then hidden_states[mask] (CUDA)
// or hidden_states.reshape(-1, H) (elsewhere: a copy unless one row makes the
// slice contiguous). Returns the [N, H] rows the kernel reads.
Var ShiftedRows(Tape& tape, const Var& hidden, const Shape& s, uint64_t batch, const Var& mask) {
  Var sliced = tape.Share(hidden);
  sliced.numel = s.positions * s.hidden_size;
  if (Grad(tape, hidden)) {
    NodeId n = tape.Node("SliceBackward0", &sliced);
    tape.graph.Edge(n, hidden, hidden.bytes(), Category::kLoss);
  }
  Var rows;
  if (s.compact) {
    // aten::index on a bool mask: nonzero() gives the [N, 2] int64 indices
    // first; IndexBackward0 keeps the mask and scatters into zeros.
    Var nz = tape.New(s.positions * 2, kI64, Category::kTemporaries, "aten::nonzero");
    rows = tape.New(sliced.numel, sliced.elem_bytes, Category::kLoss, "aten::index");
    tape.Drop(nz);
    if (Grad(tape, sliced)) {
      NodeId n = tape.Node("IndexBackward0", &rows);
      tape.graph.Save(n, mask.t);
      tape.graph.Edge(n, sliced, sliced.bytes(), Category::kLoss);
    }
  } else if (batch > 1) {
    // reshape of a non-contiguous slice: clone + _unsafe_view, whose
    // gradients pass through as views.
    rows = tape.New(sliced.numel, sliced.elem_bytes, Category::kLoss, "aten::clone");
    if (Grad(tape, sliced)) {
      NodeId n = tape.Node("CloneBackward0", &rows);
      tape.graph.EdgePass(n, sliced);
    }
  } else {
    rows = tape.Share(sliced);
  }
  tape.Drop(sliced);
  return rows;
}

// The targets: labels[mask] (CUDA; nonzero first) or labels.clamp(min=0).
Var Targets(Tape& tape, const Shape& s) {
  if (!s.compact) return tape.New(s.positions, kI64, Category::kOther, "aten::clamp");
  Var nz = tape.New(s.positions * 2, kI64, Category::kTemporaries, "aten::nonzero");
  Var targets = tape.New(s.positions, kI64, Category::kOther, "aten::index");
  tape.Drop(nz);
  return targets;
}

// One tile's fold on CPU: its peak of temporaries, allocated and freed.
void CpuFold(Tape& tape, const Shape& s, uint64_t tile_elems) {
  const uint64_t per = s.metrics ? kCpuForwardFoldBytes : kCpuForwardFoldBytesLogProbs;
  Var temps = tape.New(tile_elems * per, 1, Category::kTemporaries, "trl::_forward_tile");
  tape.Drop(temps);
}

// The forward's tile loops: hidden chunks and weight chunks cast to the
// compute dtype when they differ from it (the previous chunk's copy is still
// bound while the next is made), the GEMM into mm_buf, then the fold.
void ForwardTiles(Tape& tape, const Shape& s, const Var& rows, const Param& head) {
  Var chunk;
  for (uint64_t t0 = 0; t0 < s.positions; t0 += kTokenChunk) {
    const uint64_t n = std::min(kTokenChunk, s.positions - t0);
    if (rows.elem_bytes != s.compute) {
      Var next = tape.New(n * s.hidden_size, s.compute, Category::kTemporaries, "aten::_to_copy");
      if (chunk.t != kNoTensor) tape.Drop(chunk);
      chunk = next;
    }
    for (uint64_t v0 = 0; v0 < s.vocab; v0 += kVocabChunk) {
      const uint64_t c = std::min(kVocabChunk, s.vocab - v0);
      Var w;
      if (head.elem_bytes != s.compute) {
        w = tape.New(c * s.hidden_size, s.compute, Category::kTemporaries, "aten::_to_copy");
      }
      tape.graph.ForwardGemm();
      if (w.t != kNoTensor) tape.Drop(w);
      if (s.cpu) CpuFold(tape, s, n * c);
    }
  }
  if (chunk.t != kNoTensor) tape.Drop(chunk);
}

// What backward allocates: fp32 accumulators (unless the gradient's own dtype
// is fp32: then the accumulator is the gradient), mm_buf, and per tile the
// casts (two alive when the loop has several chunks) and the CPU folds'
// temporaries; then the gradients, cast to the inputs' dtypes.
void BackwardAllocations(Tape& tape, NodeId n, const Shape& s, const Var& rows, const Param& head,
                         bool head_grad) {
  if (Grad(tape, rows) && rows.elem_bytes != kF32) {
    tape.graph.Workspace(n, s.positions * s.hidden_size * kF32);
  }
  if (head_grad && head.elem_bytes != kF32) tape.graph.Workspace(n, head.numel * kF32);
  tape.graph.Workspace(n, s.TileRows() * kVocabChunk * s.compute);
  const uint64_t token_chunks = CeilDiv(s.positions, kTokenChunk);
  const uint64_t vocab_chunks = CeilDiv(s.vocab, kVocabChunk);
  if (rows.elem_bytes != s.compute) {
    tape.graph.Scratch(
        n, std::min<uint64_t>(2, token_chunks) * s.TileRows() * s.hidden_size * s.compute);
  }
  if (head.elem_bytes != s.compute) {
    tape.graph.Scratch(
        n, std::min<uint64_t>(2, vocab_chunks) * s.TileCols() * s.hidden_size * s.compute);
  }
  if (s.cpu) tape.graph.Scratch(n, s.TileRows() * s.TileCols() * kCpuBackwardFoldBytes);
  // An fp32 gradient is its accumulator itself, there before the loop.
  if ((Grad(tape, rows) && rows.elem_bytes == kF32) || (head_grad && head.elem_bytes == kF32)) {
    tape.graph.GradsBeforeScratch(n);
  }
  if (Grad(tape, rows)) tape.graph.Edge(n, rows, rows.bytes(), Category::kLoss);
  if (head_grad) tape.graph.Edge(n, head.var, head.numel * head.elem_bytes);
  tape.graph.Gemm(n, false);
}

struct Outputs {
  Var log_probs, entropy, mean_logits, is_top1;
};

// ChunkedLogProbFunction.forward: the statistics buffers and mm_buf, the
// tiles, then log_z, the log-probabilities (and for SFT the entropy and
// is_top1); saves the rows, the weight, the targets, log_z and the entropy.
Outputs ChunkedLogProb(Tape& tape, const Shape& s, const Var& rows, Param& head,
                       const Var& targets) {
  std::vector<Var> stats;
  for (uint64_t i = 0; i < kStatBuffers; ++i) {
    stats.push_back(tape.New(s.positions, kF32, Category::kLoss, "aten::full"));
  }
  Var mm_buf =
      tape.New(s.TileRows() * kVocabChunk, s.compute, Category::kTemporaries, "aten::empty");
  ForwardTiles(tape, s, rows, head);
  Var log_sum = tape.New(s.positions, kF32, Category::kTemporaries, "aten::log");
  Outputs o;
  Var log_z = tape.New(s.positions, kF32, Category::kLoss, "aten::add");
  tape.Drop(log_sum);
  o.log_probs = tape.New(s.positions, kF32, Category::kLoss, "aten::sub");
  if (s.metrics) {
    Var ratio = tape.New(s.positions, kF32, Category::kTemporaries, "aten::div");
    o.entropy = tape.New(s.positions, kF32, Category::kLoss, "aten::sub");
    tape.Drop(ratio);
  }
  if (s.mean_logits) o.mean_logits = tape.New(s.positions, kF32, Category::kLoss, "aten::div");
  if (s.metrics) {
    Var a = tape.New(s.positions, kBool, Category::kTemporaries, "aten::ge");
    Var b = tape.New(s.positions, kBool, Category::kTemporaries, "aten::gt");
    o.is_top1 = tape.New(s.positions, kBool, Category::kOther, "aten::bitwise_and");
    tape.Drop(a);
    tape.Drop(b);
  }
  const bool head_grad = head.trainable && tape.grad_enabled;
  if (Grad(tape, rows) || head_grad) {
    NodeId n = tape.Node("ChunkedLogProbFunctionBackward", &o.log_probs, 2);
    if (o.entropy.t != kNoTensor) {
      o.entropy.fn = n;
      o.entropy.slot = 1;
    }
    for (TensorId t : {rows.t, targets.t, log_z.t}) tape.graph.Save(n, t);
    BackwardAllocations(tape, n, s, rows, head, head_grad);
  }
  for (Var& v : stats) tape.Drop(v);
  tape.Drop(mm_buf);
  tape.Drop(log_z);
  return o;
}

// Back to [B, S-1]: x.new_zeros(mask.shape).masked_scatter(mask, x) (CUDA) or
// x.view(mask.shape).masked_fill(~mask, 0). Only the log-probabilities get a
// gradient (the entropy feeds metrics, detached).
Var Unflatten(Tape& tape, const Shape& s, const Var& x, const Var& mask, bool differentiable) {
  Var out;
  if (x.t == kNoTensor) return out;  // an output not requested
  if (s.compact) {
    Var zeros = tape.New(s.positions, x.elem_bytes, Category::kTemporaries, "aten::zeros");
    out = tape.New(s.positions, x.elem_bytes, Category::kLoss, "aten::masked_scatter");
    tape.Drop(zeros);
    if (differentiable && Grad(tape, x)) {
      NodeId n = tape.Node("MaskedScatterBackward0", &out);
      tape.graph.Save(n, mask.t);
      tape.graph.Edge(n, x, x.bytes(), Category::kLoss);
    }
    return out;
  }
  Var not_mask = tape.New(s.positions, kBool, Category::kTemporaries, "aten::bitwise_not");
  out = tape.New(s.positions, x.elem_bytes, Category::kLoss, "aten::masked_fill");
  if (differentiable && Grad(tape, x)) {
    NodeId n = tape.Node("MaskedFillBackward0", &out);
    tape.graph.Save(n, not_mask.t);
    tape.graph.Edge(n, x, x.bytes(), Category::kLoss);
  }
  tape.Drop(not_mask);
  return out;
}

// A scalar reduction of `x` (sum: its gradient is an expanded view of the
// incoming one), then negated or divided: each a one-element tensor.
Var Scalar(Tape& tape, const Var& x, std::string_view op, std::string_view backward) {
  Var out = tape.New(1, kF32, Category::kLoss, op);
  if (Grad(tape, x)) {
    NodeId n = tape.Node(backward, &out);
    if (backward == "SumBackward0") {
      tape.graph.EdgePass(n, x);
    } else {
      tape.graph.Edge(n, x, x.bytes(), Category::kLoss);
    }
  }
  return out;
}

// SFTTrainer.compute_loss (1.16): per_token_loss = -outputs.log_probs, its
// sum over the label count. The fused forward's own `loss` (-log_probs.sum()
// / count) is made first and lives with the outputs.
Var SftLoss(Tape& tape, const Var& log_probs) {
  Var sum = Scalar(tape, log_probs, "aten::sum", "SumBackward0");
  Var fused_loss = Scalar(tape, sum, "aten::div", "DivBackward0");
  tape.Drop(sum);
  Var per_token = tape.New(log_probs.numel, kF32, Category::kLoss, "aten::neg");
  if (Grad(tape, log_probs)) {
    NodeId n = tape.Node("NegBackward0", &per_token);
    tape.graph.Edge(n, log_probs, log_probs.bytes(), Category::kLoss);
  }
  Var total = Scalar(tape, per_token, "aten::sum", "SumBackward0");
  Var loss = Scalar(tape, total, "aten::div", "DivBackward0");
  tape.Drop(total);
  tape.Drop(per_token);
  tape.Drop(fused_loss);
  return loss;
}

Shape MakeShape(const Tape& tape, const Var& hidden, uint64_t rows, uint64_t tokens,
                uint64_t hidden_size, uint64_t vocab) {
  Shape s;
  s.positions = tokens - std::min(tokens, rows);
  s.hidden_size = hidden_size;
  s.vocab = vocab;
  s.compute = tape.autocast ? tape.compute_bytes : hidden.elem_bytes;
  s.cpu = tape.cpu_rules;
  s.compact = !tape.cpu_rules;
  s.metrics = true;
  s.mean_logits = false;
  return s;
}

// add_fused_lm_head's forward after the backbone: the mask, the rows, the
// kernel, and its outputs back in [B, S-1] (in `out`, in the order
// log_probs, entropy, mean_logits, is_top1, then the mask).
std::vector<Var> FusedHead(Tape& tape, const Shape& s, uint64_t rows_per_batch, const Var& hidden,
                           Param& head) {
  // mask = labels != -100 (labels = labels[:, 1:], a view).
  Var mask = tape.New(s.positions, kBool, Category::kOther, "aten::ne");
  Var rows = ShiftedRows(tape, hidden, s, rows_per_batch, mask);
  Var targets = Targets(tape, s);
  Outputs raw = ChunkedLogProb(tape, s, rows, head, targets);
  tape.Drop(rows);
  tape.Drop(targets);
  std::vector<Var> out;
  out.push_back(Unflatten(tape, s, raw.log_probs, mask, true));
  for (const Var* v : {&raw.entropy, &raw.mean_logits, &raw.is_top1}) {
    out.push_back(Unflatten(tape, s, *v, mask, false));
  }
  // The generator that unflattened them is exhausted: the kernel's outputs go.
  for (Var* v : {&raw.log_probs, &raw.entropy, &raw.mean_logits, &raw.is_top1}) tape.Drop(*v);
  out.push_back(mask);
  return out;
}

}  // namespace

Var TrlFusedLoss(Tape& tape, const TrainingSetup& setup, const Var& hidden, Param& head,
                 uint64_t tokens, uint64_t hidden_size, uint64_t vocab) {
  const uint64_t batch = std::max<uint64_t>(1, setup.batch);
  const Shape s = MakeShape(tape, hidden, batch, tokens, hidden_size, vocab);
  std::vector<Var> outputs = FusedHead(tape, s, batch, hidden, head);
  Var loss = SftLoss(tape, outputs.front());
  // compute_loss returns: the outputs (log_probs, entropy, is_top1, the mask) go.
  for (Var& v : outputs) tape.Drop(v);
  return loss;
}

Var TrlDpoLogps(Tape& tape, const TrainingSetup& setup, const Var& hidden, Param& head,
                uint64_t tokens, uint64_t hidden_size, uint64_t vocab, bool all_outputs,
                std::vector<Var>* held) {
  const uint64_t rows = std::max<uint64_t>(1, setup.batch);
  Shape s = MakeShape(tape, hidden, rows, tokens, hidden_size, vocab);
  s.metrics = all_outputs;
  s.mean_logits = all_outputs;
  std::vector<Var> outputs = FusedHead(tape, s, rows, hidden, head);
  // logps = outputs.log_probs[:, -seq_len:].sum(dim=1): its gradient is an
  // expanded view of the incoming one.
  Var logps = tape.New(rows, kF32, Category::kLoss, "aten::sum");
  if (Grad(tape, outputs.front())) {
    NodeId n = tape.Node("SumBackward1", &logps);
    tape.graph.EdgePass(n, outputs.front());
  }
  for (Var& v : outputs) {
    if (v.t != kNoTensor) held->push_back(v);
  }
  return logps;
}

}  // namespace vramscope::lower
