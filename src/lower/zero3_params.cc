#include "zero3_params.h"

#include <algorithm>
#include <limits>

#include "int_math.h"

namespace vramscope::lower {
namespace {

bool Contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}
void Erase(std::vector<int>& v, int x) { v.erase(std::remove(v.begin(), v.end(), x), v.end()); }

}  // namespace

Zero3Params::Zero3Params(ShardState* s, Options options) : s_(s), o_(options) {}

uint64_t Zero3Params::partition_numel(const Param& p) const { return CeilDiv(p.numel, s_->world); }

// mark_persistent_parameters (parameter_offload.py): a parameter of at most
// stage3_param_persistence_threshold elements is ds_persist. Init itself
// partitions every parameter (apply_param_persistence stays off in 0.19.8),
// so persistent ones are partitioned too and kept gathered once fetched.
void Zero3Params::Register() {
  for (Param& p : s_->tape->params) {
    if (p.numel == 0) continue;
    ZParam z;
    z.param = &p;
    // 4-bit weights (QLoRA): what is partitioned and gathered is the packed storage.
    z.numel = p.nf4 ? p.storage_bytes : p.numel;
    z.partition = CeilDiv(z.numel, s_->world);
    z.persist = p.numel <= o_.persistence;
    param_of_[&p] = static_cast<int>(params_.size());
    params_.push_back(z);
  }
}

void Zero3Params::GatherOnceEach() {
  Graph& g = s_->tape->graph;
  for (ZParam& z : params_) {
    if (!z.param->trainable) continue;
    const uint8_t bytes = z.param->nf4 ? 1 : z.param->elem_bytes;
    g.Drop(s_->Alloc(z.partition * s_->world * bytes, Category::kParameters,
                     "zero3::all_gather_sync"));
  }
}

void Zero3Params::Install() {
  s_->tape->module_hooks = this;
  s_->tape->graph.node_hook = [this](uint32_t id) { OnHook(id, false); };
  s_->tape->graph.replay_hook = [this](uint32_t id) { OnHook(id, true); };
}

int Zero3Params::ModuleId(std::string_view name, const std::vector<Param*>& params) {
  auto it = module_of_.find(name);
  if (it != module_of_.end()) return it->second;
  ZModule m;
  m.name = std::string(name);
  for (Param* p : params) {
    auto pit = param_of_.find(p);
    if (pit != param_of_.end() && !Contains(m.params, pit->second)) m.params.push_back(pit->second);
  }
  std::sort(m.params.begin(), m.params.end());
  modules_.push_back(std::move(m));
  module_of_.emplace(std::string(name), static_cast<int>(modules_.size() - 1));
  return static_cast<int>(modules_.size() - 1);
}

// A pass-through autograd Function on `v` whose backward runs hook `hook_id`
// (PreBackwardFunctionForModule on a module's outputs, PostBackwardFunctionModule
// on its inputs: `outputs.detach()`, a view).
void Zero3Params::Wrap(Var* v, uint32_t hook_id, std::string_view op) {
  Tape& tape = *s_->tape;
  Var w = tape.Share(*v);
  const NodeId n = tape.Node(op, &w);
  tape.graph.EdgePass(n, *v);
  tape.graph.SetNodeHook(n, hook_id);
  tape.Drop(*v);
  *v = w;
}

// The module's forward pre-hooks, in registration order: the top module's
// _start_of_forward_hook (reset_step), _pre_forward_module_hook (fetch) and
// _post_backward_module_hook (ds_grads_remaining = 0, then one
// PostBackwardFunctionModule per input that requires grad).
void Zero3Params::Enter(std::string_view name, const std::vector<Param*>& params, Var* input) {
  const int m = ModuleId(name, params);
  Graph::HookScope scope(s_->tape->graph);
  if (name.empty()) ResetStep();
  s_->tape->graph.ScriptHook(static_cast<uint32_t>(m) * 4 + kEnter + 4);
  PreForward(m);
  ZModule& mod = modules_[m];
  mod.grads_remaining = mod.inputs_with_grad = 0;
  mod.input_with_grad = input && input->requires_grad() && s_->tape->grad_enabled;
  if (input && input->requires_grad() && s_->tape->grad_enabled) {
    Wrap(input, static_cast<uint32_t>(m) * 4 + kPostBackward + 4,
         "zero3::PostBackwardFunctionModule");
    mod.grads_remaining = mod.inputs_with_grad = 1;
  }
}

// The forward hooks: _post_forward_module_hook (release), then
// _pre_backward_module_hook (PreBackwardFunctionForModule on the output).
void Zero3Params::Leave(std::string_view name, Var* output) {
  const int m = ModuleId(name, {});
  Graph::HookScope scope(s_->tape->graph);
  s_->tape->graph.ScriptHook(static_cast<uint32_t>(m) * 4 + kLeave + 4);
  modules_[m].output_node = output ? output->fn : kNoNode;
  PostForward(m);
  if (output && output->requires_grad() && s_->tape->grad_enabled) {
    Wrap(output, static_cast<uint32_t>(m) * 4 + kPreBackward + 4,
         "zero3::PreBackwardFunctionForModule");
  }
}

// A hook id is 4 * module + kind + 4 (0 means none). `replay`: a checkpoint
// region's recompute runs the module's forward hooks again
// (in_checkpoint_recompute: forward while a backward graph task runs).
void Zero3Params::OnHook(uint32_t id, bool replay) {
  const int m = static_cast<int>(id / 4) - 1;
  Graph::HookScope scope(s_->tape->graph);
  recompute_ = replay;
  switch (id % 4) {
    case kEnter:
      PreForward(m);
      modules_[m].grads_remaining = modules_[m].inputs_with_grad;
      break;
    case kLeave: PostForward(m); break;
    case kPreBackward:
      // pre_sub_module_backward_function
      InvalidateIfOffTrace(m);
      if (trace_ == Trace::kRecord) {
        submodule_order_.push_back(m);
        module_steps_[m].push_back(step_id_);
      }
      Fetch(m, false);
      break;
    case kPostBackward:
      if (--modules_[m].grads_remaining == 0) Release(m, false);
      break;
  }
  recompute_ = false;
}

// pre_sub_module_forward_function: trace_prologue, record_module while
// recording, fetch_sub_module(forward=True).
void Zero3Params::PreForward(int m) {
  InvalidateIfOffTrace(m);
  if (trace_ == Trace::kRecord) {
    submodule_order_.push_back(m);
    module_steps_[m].push_back(step_id_);
  }
  Fetch(m, true);
}

void Zero3Params::PostForward(int m) { Release(m, true); }

// trace_prologue: a complete trace that does not expect this module here is
// invalidated (and recorded again from the next forward).
void Zero3Params::InvalidateIfOffTrace(int m) {
  if (trace_ != Trace::kComplete) return;
  if (static_cast<size_t>(step_id_) < submodule_order_.size() && submodule_order_[step_id_] == m)
    return;
  trace_ = Trace::kInvalid;
  submodule_order_.clear();
  param_order_.clear();
  most_recent_.clear();
  module_steps_.clear();
  queue_.clear();
  CleanInflight();
}

// reset_step, at the start of every forward: the in-flight parameters are
// waited for and released; the first forward starts recording the trace,
// the second completes it (the fetch order of one forward and backward,
// construct_parameter_trace_from_module_trace).
void Zero3Params::ResetStep() {
  CleanInflight();
  if (trace_ == Trace::kRecord) {
    BuildParamTrace();
    trace_ = Trace::kComplete;
  } else if (trace_ == Trace::kInvalid) {
    trace_ = Trace::kRecord;
  }
  queue_.assign(param_order_.begin(), param_order_.end());
  most_recent_.clear();
  module_steps_.clear();
  step_id_ = 0;
  n_available_ = 0;
}

void Zero3Params::BuildParamTrace() {
  param_order_.clear();
  for (int m : submodule_order_) {
    std::deque<int>& steps = module_steps_[m];
    const int step = steps.empty() ? 0 : steps.front();
    if (!steps.empty()) steps.pop_front();
    for (int p : modules_[m].params) param_order_.push_back(InTrace{p, step});
  }
}

// _clean_inflight_param_registry: every handle waited for, its parameters
// released, in the registry's order.
void Zero3Params::CleanInflight() {
  std::vector<std::pair<int, int>> inflight;  // (handle, param)
  for (size_t p = 0; p < params_.size(); ++p) {
    if (params_[p].handle >= 0) inflight.emplace_back(params_[p].handle, static_cast<int>(p));
  }
  std::sort(inflight.begin(), inflight.end());
  for (const auto& [h, p] : inflight) {
    (void)h;
    Wait(p);
    ReleaseParam(p);
  }
}

// fetch_sub_module: the module's parameters not yet gathered are all-gathered
// (one handle), each parameter marked active for the module and waited for;
// with a complete trace the next parameters are prefetched; step_id moves on.
// A frozen parameter fetched by a recompute's forward is also attributed to
// the module last entered in backward (update_recompute_parameters: it is
// active for that module too), which releases it after its own backward.
void Zero3Params::Fetch(int m, bool forward) {
  Graph& g = s_->tape->graph;
  // The computation stream is assumed two fetches behind the CPU (DeepSpeed
  // throttles the all-gather stream at __max_ongoing_fetch_events = 2).
  if (released_.groups() >= 2) released_.CompleteOldest(g);
  const std::vector<int> mine = modules_[m].params;
  if (!forward && !Contains(active_backward_, m)) active_backward_.push_back(m);
  AllGather(mine);
  for (int p : mine) {
    if (!Contains(params_[p].active, m)) params_[p].active.push_back(m);
    if (recompute_ && forward && !active_backward_.empty() && !params_[p].param->trainable) {
      // update_recompute_parameters: the backward module also holds it active.
      const int owner = active_backward_.back();
      if (!Contains(modules_[owner].recompute, p)) modules_[owner].recompute.push_back(p);
      if (!Contains(params_[p].active, owner)) params_[p].active.push_back(owner);
    }
    if (params_[p].handle >= 0) Wait(p);
  }
  if (trace_ == Trace::kComplete) Prefetch(mine);
  ++step_id_;
}

// The prefetch of fetch_sub_module: this module's own entries are taken off
// the queue, then entries are popped until stage3_prefetch_bucket_size
// elements (bounded by stage3_max_live_parameters less those available) of
// not-yet-gathered parameters are taken, all-gathered as one handle.
void Zero3Params::Prefetch(const std::vector<int>& fetched) {
  auto recent = [this](int p) {
    auto it = most_recent_.find(p);
    return it == most_recent_.end() ? std::numeric_limits<int>::min() : it->second;
  };
  size_t not_fetched = 0;
  for (int p : fetched) not_fetched += recent(p) < step_id_ ? 1 : 0;
  for (size_t taken = 0; !queue_.empty() && taken < not_fetched; ++taken) {
    most_recent_[queue_.front().param] = queue_.front().step;
    queue_.pop_front();
  }
  if (o_.prefetch_bucket == 0) return;
  const int64_t room = static_cast<int64_t>(o_.max_live) - n_available_;
  const int64_t limit = std::min<int64_t>(room, static_cast<int64_t>(o_.prefetch_bucket));
  std::vector<int> prefetch;
  int64_t numel = 0;
  while (!queue_.empty() && numel < limit) {
    const InTrace entry = queue_.front();
    queue_.pop_front();
    const bool gather =
        params_[entry.param].status == Status::kNotAvailable && !Contains(prefetch, entry.param);
    most_recent_[entry.param] = std::max(recent(entry.param), entry.step);
    if (gather) {
      prefetch.push_back(entry.param);
      numel += static_cast<int64_t>(params_[entry.param].numel);
    }
  }
  if (numel > 0) AllGather(prefetch);
}

// __all_gather_params -> all_gather_coalesced, per dtype: one parameter is
// gathered into its own padded buffer (_all_gather_sequential: its data is a
// view of it); several into one flat buffer of their padded partitions
// (_all_gather_dtype), each copied out into a tensor of its own at the wait
// (AllGatherCoalescedHandle.wait: torch.cat of the parts). With offload_param
// each partition is first copied to the device (ds_tensor.to(device)).
void Zero3Params::AllGather(const std::vector<int>& params) {
  Graph& g = s_->tape->graph;
  std::map<uint8_t, std::vector<int>> by_dtype;
  for (int p : params) {
    if (params_[p].status != Status::kNotAvailable) continue;
    n_available_ += static_cast<int64_t>(params_[p].numel);
    by_dtype[params_[p].param->nf4 ? 1 : params_[p].param->elem_bytes].push_back(p);
  }
  for (auto& [bytes, group] : by_dtype) {
    std::sort(group.begin(), group.end());
    uint64_t padded = 0;
    std::vector<TensorId> staged;
    for (int p : group) {
      padded += params_[p].partition * s_->world;
      // CPU rules: the host partition is already on the device.
      if (o_.offload_params && !s_->tape->cpu_rules) {
        staged.push_back(g.Alloc(params_[p].partition * bytes, Category::kParameters,
                                 "zero3::partition_to_device", s_->tape->module(),
                                 o_.gather_stream));
      }
    }
    Handle h;
    h.params = group;
    h.refs = static_cast<int>(group.size());
    const TensorId buffer = g.Alloc(padded * bytes, Category::kParameters, "zero3::all_gather",
                                    s_->tape->module(), o_.gather_stream);
    for (TensorId t : staged) g.Drop(t);
    if (group.size() == 1) {
      params_[group[0]].data = buffer;
    } else {
      h.flat = buffer;
    }
    for (int p : group) {
      params_[p].status = Status::kInflight;
      params_[p].handle = static_cast<int>(handles_.size());
    }
    handles_.push_back(std::move(h));
  }
}

// The registry's handle for `p` is popped and waited for: a coalesced one
// copies every parameter out at its first wait; its flat buffer goes with
// the last registry entry holding the handle.
void Zero3Params::Wait(int p) {
  Graph& g = s_->tape->graph;
  Handle& h = handles_[params_[p].handle];
  params_[p].handle = -1;
  if (!h.complete) {
    h.complete = true;
    for (int q : h.params) {
      if (h.flat != kNoTensor) {
        const uint8_t bytes = params_[q].param->nf4 ? 1 : params_[q].param->elem_bytes;
        params_[q].data = g.Alloc(params_[q].numel * bytes, Category::kParameters, "aten::cat",
                                  s_->tape->module(), o_.gather_stream);
      }
      params_[q].status = Status::kAvailable;
    }
  }
  if (--h.refs == 0 && h.flat != kNoTensor) {
    g.Drop(h.flat);
    h.flat = kNoTensor;
  }
}

// release_sub_module: with a complete trace, the module's parameters not
// persistent, not prefetched for a later use and not used again within
// stage3_max_reuse_distance elements of the trace (__params_to_release);
// while recording, all of them. After backward, the parameters a recompute
// attributed to it too.
void Zero3Params::Release(int m, bool forward) {
  ZModule& mod = modules_[m];
  std::vector<int> release = trace_ == Trace::kComplete ? ToRelease(m) : mod.params;
  std::vector<int> touched = mod.params;
  if (!forward) {
    for (int p : mod.recompute) {
      if (!params_[p].persist && !Contains(release, p)) release.push_back(p);
      if (!Contains(touched, p)) touched.push_back(p);
    }
    mod.recompute.clear();
    Erase(active_backward_, m);
  }
  // A non-reentrant recompute's saved weights (`x.detach()` of the gathered
  // data) keep the storage until the module's node has run, though the
  // parameter itself is released (and gathered again for its backward).
  // So do a plain forward's saved weights with torch's F.linear (DeepSpeed
  // before 0.19.4 without zero.Init: `weight.t()` views; an embedding saves
  // its indices only; a checkpointed region saves handles or nothing).
  const bool plain_pin = forward && !recompute_ && o_.forward_saves_storage &&
                         mod.input_with_grad && !s_->tape->graph.in_checkpoint() &&
                         mod.name.find(":embedding") == std::string::npos;
  const bool pinned =
      plain_pin || (forward && recompute_ && s_->tape->graph.recomputing_by_storage());
  for (int p : touched) {
    Erase(params_[p].active, m);
    if (Contains(release, p)) ReleaseParam(p, pinned ? mod.output_node : kNoNode);
  }
  released_.EndGroup();
}

std::vector<int> Zero3Params::ToRelease(int m) const {
  std::vector<int> release;
  for (int p : modules_[m].params) {
    auto it = most_recent_.find(p);
    const bool later = it != most_recent_.end() && it->second > step_id_;
    if (!params_[p].persist && !later) release.push_back(p);
  }
  uint64_t traversed = 0;
  for (size_t i = static_cast<size_t>(step_id_); i < submodule_order_.size(); ++i) {
    if (traversed >= o_.max_reuse) break;
    for (int p : modules_[submodule_order_[i]].params) {
      Erase(release, p);
      traversed += params_[p].numel;
    }
  }
  return release;
}

// __release_param -> partition -> free_param (`param.data = torch.empty(0)`,
// after record_stream on the computation stream).
void Zero3Params::ReleaseParam(int p, NodeId pin) {
  ZParam& z = params_[p];
  if (z.status != Status::kAvailable || !z.active.empty()) return;
  Graph& g = s_->tape->graph;
  if (z.data != kNoTensor) {
    if (pin != kNoNode) {
      g.HoldUntilRun(pin, z.data);
    } else if (s_->tape->cpu_rules) {
      g.Drop(z.data);
    } else {
      released_.Add(g.DropUsedOn(z.data, kDefaultStream));
    }
  }
  z.data = kNoTensor;
  z.status = Status::kNotAvailable;
  n_available_ -= static_cast<int64_t>(z.numel);
}

// release_backward_leftovers: modules whose post-backward hook never fired
// (an input that needs no gradient: the embedding) release their non-
// persistent parameters, the last activated first.
void Zero3Params::ReleaseBackwardLeftovers() {
  Graph::HookScope scope(s_->tape->graph);
  while (!active_backward_.empty()) {
    const int m = active_backward_.back();
    active_backward_.pop_back();
    std::vector<int> touched = modules_[m].params;
    for (int p : modules_[m].recompute) {
      if (!Contains(touched, p)) touched.push_back(p);
    }
    modules_[m].recompute.clear();
    for (int p : touched) {
      Erase(params_[p].active, m);
      if (!params_[p].persist) ReleaseParam(p);
    }
  }
  released_.CompleteAll(s_->tape->graph);
}

void Zero3Params::ReleaseAll() {
  for (size_t p = 0; p < params_.size(); ++p) {
    if (params_[p].handle >= 0) Wait(static_cast<int>(p));
    params_[p].active.clear();
    ReleaseParam(static_cast<int>(p));
  }
  released_.CompleteAll(s_->tape->graph);
}

// _post_step: persistent_parameters[0].all_gather(persistent_parameters),
// synchronous: one padded buffer per parameter (_allgather_params_coalesced
// or _sequential), each the parameter's data.
void Zero3Params::GatherPersistent() {
  for (ZParam& z : params_) {
    if (!z.persist || z.status != Status::kNotAvailable) continue;
    const uint8_t bytes = z.param->nf4 ? 1 : z.param->elem_bytes;
    z.data =
        s_->Alloc(z.partition * s_->world * bytes, Category::kParameters, "zero3::all_gather_sync");
    z.status = Status::kAvailable;
  }
}

}  // namespace vramscope::lower
