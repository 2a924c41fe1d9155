// The PyTorch ops of a diffusion UNet that a transformer does not use, as
// memory sees them (same conventions as ops.h: inputs borrowed, a new
// reference returned). Shapes are element counts: a [N, C, H, W] activation is
// `numel` elements of its dtype.
#pragma once

#include <cstdint>

#include "tape.h"

namespace vramscope::lower {

// nn.Conv2d (aten::convolution). ConvolutionBackward0 saves the input and the
// weight whenever it exists (derivatives.yaml: convolution_backward reads both
// for every output), and its backward allocates grad_input, grad_weight and
// grad_bias for the inputs that need them, in that order (torch 2.13 CPU trace
// of diffusers' UNet). Under autocast conv2d is a lower-precision op: bias,
// weight and input are cast (right to left, as for linear). cuDNN's workspace
// is not modelled (its size depends on the algorithm cuDNN picks at run time).
Var Conv2d(Tape& tape, const Var& x, Param& weight, Param* bias, uint64_t out_numel);

// nn.GroupNorm (aten::native_group_norm): the output like the input, mean and
// rstd [N, groups] in fp32 when input and weight dtypes differ, else in the
// input's dtype (torch 2.13, checked in tools/reference/tests/test_torch_facts.py).
// Saves input, mean, rstd (and the weight). CUDA autocast runs group_norm in
// fp32 (autocast_mode.cpp's fp32 list): a half input is copied to fp32 first and
// the output is fp32; CPU autocast leaves it in the input's dtype.
Var GroupNorm(Tape& tape, const Var& x, Param& weight, Param& bias, uint64_t rows);

// F.interpolate(x, scale_factor=2.0, mode="nearest"): a 4x larger output;
// UpsampleNearest2DBackward0 saves nothing and allocates an input-sized gradient.
Var UpsampleNearest2x(Tape& tape, const Var& x);

// torch.cat([a, b], dim=1): a new tensor; CatBackward0 saves nothing and hands
// each input a narrowed view of its gradient (no new storage).
Var CatChannels(Tape& tape, const Var& a, const Var& b);

// x.permute(...).contiguous() or .reshape() of a permuted tensor that cannot be
// a view: aten::clone (CloneBackward0 passes the gradient on).
Var Contiguous(Tape& tape, const Var& x);

// F.mse_loss(pred, target) with reduction "mean": a scalar; MseLossBackward0
// saves both operands and allocates a pred-sized gradient (the target needs none).
Var MseLoss(Tape& tape, const Var& pred, const Var& target);

// get_timestep_embedding (diffusers 0.42.1 embeddings.py) for `n` timesteps of
// `dim` features: fp32 temporaries in the order the function makes and drops
// them (torch 2.13 CPU trace). `copy_steps`: the timesteps are not fp32, so
// `timesteps[:, None].float()` copies them. Returns the [n, dim] fp32 embedding.
Var SinusoidalEmbedding(Tape& tape, uint64_t n, uint64_t dim, bool copy_steps = true);

}  // namespace vramscope::lower
