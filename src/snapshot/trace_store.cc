// TraceStore / Trace (snapshot.h): trace entries packed in 16 bytes.
#include "vramscope/snapshot.h"

namespace vramscope {

TraceStore::Packed TraceStore::Pack(const TraceEntry& e) {
  const auto action = static_cast<uint64_t>(e.action);
  if (e.addr > kAddrMask || e.size_bytes > kSizeMask || e.stack > kStackMask) {
    overflow_.push_back(e);
    return Packed{overflow_.size() - 1, kEscape << 60};
  }
  return Packed{e.addr | (uint64_t{e.stream} << 48),
                e.size_bytes | (uint64_t{e.stack} << 36) | (action << 60)};
}

void TraceStore::Append(const TraceEntry& e) {
  if ((size_ & kPageMask) == 0) {
    // Default-initialised: the kernel commits a page's memory as it is written.
    pages_.emplace_back(new Packed[kPageMask + 1]);
  }
  pages_[size_ >> kPageBits][size_ & kPageMask] = Pack(e);
  ++size_;
}

void TraceStore::Set(uint64_t i, const TraceEntry& e) {
  Packed& p = pages_[i >> kPageBits][i & kPageMask];
  if ((p.hi >> 60) == kEscape) {
    overflow_[p.lo] = e;  // stays escaped (rare; simpler than reclaiming)
    return;
  }
  p = Pack(e);
}

void Trace::push_back(const TraceEntry& e) {
  if (!store_ || store_.use_count() > 1 || begin_ + size_ != store_->size()) {
    auto own = std::make_shared<TraceStore>();
    for (uint64_t i = 0; i < size_; ++i) own->Append(store_->Get(begin_ + i));
    store_ = std::move(own);
    begin_ = 0;
  }
  store_->Append(e);
  ++size_;
}

}  // namespace vramscope
