// torchtune's OffloadActivations (training/_activation_offloading.py, 0.6.1;
// TRL's models/activation_offloading.py is a later copy), as Graph methods:
// autograd.h, `offload_activations`, says what is modelled.
#include <algorithm>

#include "autograd.h"
#include "vramscope/result.h"

namespace vramscope::lower {
namespace {

// OffloadActivations(min_offload_size=1024, max_fwd_stash_size=5), the values
// get_act_offloading_ctx_manager constructs it with.
constexpr uint64_t kMinOffloadBytes = 1024;
constexpr uint64_t kMaxFwdStash = 5;

}  // namespace

bool Graph::Pack(TensorId t, Packed* packed) {
  // pack_tensor: every call takes an id, offloaded or not.
  const uint64_t id = ++next_pack_id_;
  const uint64_t bytes = tensors_[t].bytes;
  const Category category = out_->events()[tensors_[t].event_index].category;
  // Small tensors, nn.Parameters and nn.Buffers stay as they are (the tracker
  // holds them).
  if (bytes < kMinOffloadBytes || category == Category::kParameters) return false;
  // The stash keeps the device tensors of the last kMaxFwdStash ids; older ones
  // go once their copy is done (s0.wait_event, then del).
  while (!fwd_stash_.empty() && fwd_stash_.front().first + kMaxFwdStash <= id) {
    Drop(fwd_stash_.front().second);
    fwd_stash_.erase(fwd_stash_.begin());
  }
  Ref(t);
  fwd_stash_.emplace_back(id, t);
  host_live_bytes_ += bytes;
  host_peak_bytes_ = std::max(host_peak_bytes_, host_live_bytes_);
  MarkSaved(t);
  *packed = Packed{id, t, bytes, 0};
  return true;
}

TensorId Graph::Unpack(const Packed& p, std::vector<TensorId>* brought_back) {
  // The tracker entry goes: the pinned copy is freed.
  host_live_bytes_ -= p.bytes;
  // Still in the forward stash (the last tensors of the forward): used as it is.
  for (const auto& [id, t] : fwd_stash_) {
    if (id == p.id) {
      Ref(t);
      return t;
    }
  }
  // .to("cuda", non_blocking=True) on the side stream; the backward stash holds
  // it (the first reference), the caller the second.
  const TensorId copy = Alloc(p.bytes, Category::kActivations, "aten::_to_copy", module_);
  Ref(copy);
  brought_back->push_back(copy);
  return copy;
}

void Graph::BringBackInputs(Region& r, std::vector<TensorId>* brought_back) {
  // The recompute unpacks the frame's saved inputs (get_inputs) and holds them
  // as its arguments until it returns.
  for (const Packed& p : r.packed_inputs) r.kept[p.kept_index] = Unpack(p, brought_back);
}

std::vector<TensorId> Graph::UnpackPacked(const Node& node, std::vector<TensorId>* brought_back) {
  std::vector<TensorId> unpacked;
  unpacked.reserve(node.packed.size());
  for (const Packed& p : node.packed) unpacked.push_back(Unpack(p, brought_back));
  return unpacked;
}

void Graph::AfterUnpackingNode(const std::vector<TensorId>& brought_back) {
  // The hook registered on the node (before it releases its saved variables):
  // a tensor it brought back that something else now references (the
  // recompute's saves) leaves the backward stash at once (record_stream, del);
  // the rest stay until the next such node's hook.
  std::vector<TensorId> stay;
  for (TensorId t : brought_back) {
    if (tensors_[t].refs > 1) {
      Drop(t);
    } else {
      stay.push_back(t);
    }
  }
  // Then the whole forward stash goes, and what earlier nodes brought back.
  for (const auto& [id, t] : fwd_stash_) Drop(t);
  fwd_stash_.clear();
  for (TensorId t : bwd_stash_) Drop(t);
  bwd_stash_ = std::move(stay);
}

void Graph::ReleaseOffloadStashes() {
  // wait_and_del_remaining_references, queued at the first unpack: runs when
  // the backward's graph task ends.
  for (TensorId t : bwd_stash_) Drop(t);
  bwd_stash_.clear();
  for (const auto& [id, t] : fwd_stash_) Drop(t);
  fwd_stash_.clear();
}

bool Graph::KeptOwned(const Region& r, size_t kept_index) const {
  return std::none_of(r.packed_inputs.begin(), r.packed_inputs.end(),
                      [kept_index](const Packed& p) { return p.kept_index == kept_index; });
}

}  // namespace vramscope::lower
