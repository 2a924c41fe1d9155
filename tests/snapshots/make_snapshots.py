#!/usr/bin/python3
"""Writes the test snapshots of vramscope's snapshot reader (no torch needed).

    /usr/bin/python3 tests/snapshots/make_snapshots.py

Outputs (deterministic; commit them):
  tests/data/snapshots/    snapshots in exactly the structure
                           torch.cuda.memory._dump_snapshot() writes
                           (torch/csrc/cuda/Module.cpp, THCPModule_memorySnapshot,
                           torch 2.5+), pickled with Python's pickle at protocols 2-5,
                           plus a JSON copy and value-coverage pickles
                           and the same run in the structure of each
                           generation of torch (layout_snapshot, docs/snapshot.md
                           "Structure by release"): torch1_13, torch2_0, torch2_1,
                           newest
  tests/bad_inputs/snapshot/  malformed, truncated and hostile files
  fuzz/corpus/snapshot/    fuzzing seeds

The allocator trace comes from MiniAllocator, a small re-implementation of
PyTorch's native CUDACachingAllocator rules for the default settings
(c10/cuda/CUDACachingAllocator.cpp): 512-byte rounding, small pool <= 1 MiB in
2 MiB segments, 1-10 MiB requests in 20 MiB segments, larger ones rounded to 2
MiB, best fit by (size, address) per stream and pool, split when the remainder
is >= 512 bytes (small pool) or > 1 MiB (large pool), merge with free
neighbours on free, release of whole free segments on empty_cache and before
the OOM retry. Its trace entries are what the real allocator records:
segment_alloc before the alloc that needed it, alloc with the requested size,
free_requested then free_completed, segment_free, and oom with device_free.

Frames look like a real run: shared frame dicts and shared frame lists (as
py_symbolize shares them, so the pickles hold memo references), innermost
frame first, Python frames for the main thread and C++ frames for the autograd
engine thread (stacks="all").
"""
import json
import os
import pickle
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "snapshots")
BAD = os.path.join(ROOT, "tests", "bad_inputs", "snapshot")
CORPUS = os.path.join(ROOT, "fuzz", "corpus", "snapshot")

KiB = 1 << 10
MiB = 1 << 20
SMALL_SIZE = 1 * MiB        # kSmallSize: small pool for rounded sizes <= 1 MiB
SMALL_BUFFER = 2 * MiB      # kSmallBuffer
LARGE_BUFFER = 20 * MiB     # kLargeBuffer
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE = 2 * MiB       # kRoundLarge
MIN_BLOCK = 512             # kMinBlockSize


def round_size(n):
    return MIN_BLOCK if n < MIN_BLOCK else MIN_BLOCK * ((n + MIN_BLOCK - 1) // MIN_BLOCK)


def allocation_size(n):
    if n <= SMALL_SIZE:
        return SMALL_BUFFER
    if n < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((n + ROUND_LARGE - 1) // ROUND_LARGE)


class OutOfMemory(Exception):
    pass


class Block:
    def __init__(self, addr, size, segment):
        self.addr, self.size, self.segment = addr, size, segment
        self.allocated = False
        self.requested = 0
        self.frames = None
        self.prev = self.next = None


class Segment:
    def __init__(self, addr, size, stream, small, frames):
        self.addr, self.size, self.stream, self.small, self.frames = addr, size, stream, small, frames
        self.first = None


class MiniAllocator:
    def __init__(self, limit_bytes=1 << 62, strings=None):
        self.limit = limit_bytes
        self.reserved = 0
        self.allocated = 0
        self.peak_reserved = 0
        self.peak_allocated = 0
        self.segments = []
        self.pools = {}          # (stream, small) -> set of free blocks
        self.live = {}           # addr -> allocated block
        self.trace = []
        self.next_addr = 0x7F5A00000000
        self.s = strings

    def _record(self, action, addr, size, stream, frames):
        e = {self.s["action"]: self.s[action]}
        e[self.s["device_free" if action == "oom" else "addr"]] = addr
        e[self.s["size"]] = size
        e[self.s["stream"]] = stream
        e[self.s["time_us"]] = 1700000000000000 + 10 * len(self.trace)
        if frames is not None:
            e[self.s["frames"]] = frames
        self.trace.append(e)

    def _pool(self, stream, small):
        return self.pools.setdefault((stream, small), set())

    def _release_cached(self):
        # release_cached_blocks: every segment that is one free block goes back.
        for seg in sorted(self.segments, key=lambda g: (not g.small, g.stream, g.size, g.addr)):
            b = seg.first
            if not b.allocated and b.next is None:
                self._pool(seg.stream, seg.small).discard(b)
                self.segments.remove(seg)
                self.reserved -= seg.size
                self._record("segment_free", seg.addr, seg.size, seg.stream, seg.frames)

    def empty_cache(self):
        self._release_cached()

    def malloc(self, n, stream=0, frames=None):
        size = round_size(n)
        small = size <= SMALL_SIZE
        pool = self._pool(stream, small)
        fits = [b for b in pool if b.size >= size]
        if fits:
            block = min(fits, key=lambda b: (b.size, b.addr))
            pool.discard(block)
        else:
            alloc = allocation_size(size)
            if self.reserved + alloc > self.limit:
                self._release_cached()
            if self.reserved + alloc > self.limit:
                self._record("oom", self.limit - self.reserved, size, stream, frames)
                raise OutOfMemory(n)
            seg = Segment(self.next_addr, alloc, stream, small, frames)
            self.next_addr += alloc + 2 * MiB  # cudaMalloc ranges are not adjacent
            block = Block(seg.addr, alloc, seg)
            seg.first = block
            self.segments.append(seg)
            self.reserved += alloc
            self.peak_reserved = max(self.peak_reserved, self.reserved)
            self._record("segment_alloc", seg.addr, alloc, stream, frames)
        remaining = block.size - size
        split = remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE
        if split:
            rest = Block(block.addr + size, remaining, block.segment)
            rest.prev, rest.next = block, block.next
            if block.next:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.add(rest)
        block.allocated = True
        block.requested = n
        block.frames = frames
        self.live[block.addr] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self._record("alloc", block.addr, n, stream, frames)
        return block.addr

    def free(self, addr, frames=None):
        block = self.live.pop(addr)
        seg = block.segment
        self.allocated -= block.size
        ctx = frames if frames is not None else block.frames
        self._record("free_requested", addr, block.requested, seg.stream, ctx)
        self._record("free_completed", addr, block.requested, seg.stream, ctx)
        block.allocated = False
        pool = self._pool(seg.stream, seg.small)
        for other in (block.prev, block.next):
            if other is not None and not other.allocated:
                pool.discard(other)
                if other is block.prev:
                    other.size += block.size
                    other.next = block.next
                    if block.next:
                        block.next.prev = other
                    block = other
                else:
                    block.size += other.size
                    block.next = other.next
                    if other.next:
                        other.next.prev = block
        if block.prev is None:
            seg.first = block
        pool.add(block)

    def snapshot_segments(self, s, empty_frames):
        out = []
        for seg in sorted(self.segments, key=lambda g: g.addr):
            blocks = []
            b = seg.first
            allocated = active = requested = 0
            while b is not None:
                d = {s["address"]: b.addr, s["size"]: b.size,
                     s["requested_size"]: b.requested if b.allocated else 0,
                     s["state"]: s["active_allocated"] if b.allocated else s["inactive"]}
                d[s["frames"]] = b.frames if (b.allocated and b.frames is not None) else empty_frames
                if b.allocated:
                    allocated += b.size
                    active += b.size
                    requested += b.requested
                blocks.append(d)
                b = b.next
            d = {s["device"]: 0, s["address"]: seg.addr, s["total_size"]: seg.size,
                 s["allocated_size"]: allocated, s["active_size"]: active,
                 s["requested_size"]: requested, s["stream"]: seg.stream,
                 s["segment_type"]: s["small"] if seg.small else s["large"],
                 s["segment_pool_id"]: (0, 0), s["is_expandable"]: False,
                 s["frames"]: seg.frames if seg.frames is not None else empty_frames,
                 s["blocks"]: blocks}
            out.append(d)
        return out


# One str object per key, as THCPModule_memorySnapshot reuses its py::str
# objects: the pickler then writes each once and memo references after.
KEYS = ["action", "addr", "device_free", "size", "stream", "time_us", "frames", "alloc",
        "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "device",
        "address", "total_size", "allocated_size", "active_size", "requested_size",
        "segment_type", "segment_pool_id", "large", "small", "state", "active_allocated",
        "active_pending_free", "inactive", "is_expandable", "blocks", "name", "filename", "line"]


def strings():
    return {k: "".join(list(k)) for k in KEYS}  # fresh objects, shared within one snapshot


class Frames:
    """Shared frame dicts and frame lists, like py_symbolize."""

    def __init__(self, s):
        self.s = s
        self.dicts = {}
        self.lists = {}

    def frame(self, name, filename, line):
        key = (name, filename, line)
        if key not in self.dicts:
            self.dicts[key] = {self.s["name"]: name, self.s["filename"]: filename, self.s["line"]: line}
        return self.dicts[key]

    def stack(self, *frames):
        key = tuple(frames)
        if key not in self.lists:
            self.lists[key] = [self.frame(*f) for f in frames]
        return self.lists[key]


TORCH = "/env/site-packages/torch"
MODULE = (f"{TORCH}/nn/modules/module.py")
USER = "/work/train.py"
MODEL = "/work/tiny_lm.py"


def run_training(alloc, fr, steps=2, oom_at=None):
    """A one-layer language model trained with AdamW: what each phase allocates."""
    main = ("<module>", USER, 88)
    loop = ("train", USER, 61)
    load = fr.stack(("_apply", MODULE, 930), ("to", MODULE, 1340), ("load_model", USER, 20), main)
    data = fr.stack(("train", USER, 55), main)

    def fwd(name, line):
        return fr.stack((name, MODEL, line), ("_call_impl", MODULE, 1750),
                        ("forward", MODEL, 40), ("train", USER, 57))

    def bwd(node):
        return fr.stack((f"torch::autograd::generated::{node}::apply", "??", 0),
                        ("torch::autograd::Engine::evaluate_function", "??", 0),
                        ("torch::autograd::Engine::thread_main", "??", 0))

    accumulate = fr.stack(("torch::autograd::AccumulateGrad::apply", "??", 0),
                          ("torch::autograd::Engine::evaluate_function", "??", 0),
                          ("torch::autograd::Engine::thread_main", "??", 0))
    loss_stack = fr.stack(("cross_entropy", f"{TORCH}/nn/functional.py", 3494), ("train", USER, 58))
    opt_init = fr.stack(("_init_group", f"{TORCH}/optim/adamw.py", 150), ("step", f"{TORCH}/optim/adamw.py", 209),
                        ("wrapper", f"{TORCH}/optim/optimizer.py", 487), ("train", USER, 60))
    opt_tmp = fr.stack(("_multi_tensor_adamw", f"{TORCH}/optim/adamw.py", 530),
                       ("step", f"{TORCH}/optim/adamw.py", 220), ("wrapper", f"{TORCH}/optim/optimizer.py", 487),
                       ("train", USER, 60))
    zero_grad = fr.stack(("zero_grad", f"{TORCH}/optim/optimizer.py", 980), loop)
    workspace_fwd = fr.stack(("at::cuda::getNewWorkspace", "??", 0), ("at::cuda::getCurrentCUDABlasHandle", "??", 0),
                             ("linear", MODEL, 12), ("forward", MODEL, 40), ("train", USER, 57))
    workspace_bwd = fr.stack(("at::cuda::getNewWorkspace", "??", 0), ("at::cuda::getCurrentCUDABlasHandle", "??", 0),
                             ("torch::autograd::generated::MmBackward0::apply", "??", 0),
                             ("torch::autograd::Engine::thread_main", "??", 0))

    tokens, hidden, ffn, vocab = 512, 1024, 4096, 8192
    params = {"embed": vocab * hidden * 4, "qkv": 3 * hidden * hidden * 4, "o": hidden * hidden * 4,
              "up": hidden * ffn * 4, "down": ffn * hidden * 4, "norm": hidden * 4,
              "lm_head": vocab * hidden * 4}
    p_addr = {k: alloc.malloc(v, 0, load) for k, v in params.items()}
    grads, state = {}, {}
    workspaces = []
    side_stream = 0x55D0C0FFEE00  # a second CUDA stream (cudaStream_t value)
    act = tokens * hidden * 4

    for step in range(1, steps + 1):
        x = alloc.malloc(tokens * 8, 0, data)
        # forward: what autograd saves stays until backward frees it
        saved = []
        if not workspaces:
            workspaces.append(alloc.malloc(8519680, 0, workspace_fwd))  # cuBLAS workspace, main thread
        saved.append(alloc.malloc(act, 0, fwd("embedding", 10)))
        saved.append(alloc.malloc(act, 0, fwd("rms_norm", 14)))
        saved.append(alloc.malloc(3 * act, 0, fwd("linear", 12)))     # qkv
        scores = alloc.malloc(8 * tokens * tokens * 4, 0, fwd("attention", 20))
        saved.append(alloc.malloc(8 * tokens * tokens * 4, 0, fwd("softmax", 21)))
        alloc.free(scores)
        saved.append(alloc.malloc(act, 0, fwd("attention", 22)))
        saved.append(alloc.malloc(act, 0, fwd("linear", 12)))         # o
        saved.append(alloc.malloc(tokens * ffn * 4, 0, fwd("linear", 12)))  # up
        saved.append(alloc.malloc(tokens * ffn * 4, 0, fwd("gelu", 30)))
        tmp = alloc.malloc(tokens * ffn * 4, 0, fwd("dropout", 31))
        alloc.free(tmp)
        saved.append(alloc.malloc(act, 0, fwd("linear", 12)))         # down
        logits = alloc.malloc(tokens * vocab * 4, 0, fwd("linear", 12))
        logp = alloc.malloc(tokens * vocab * 4, 0, loss_stack)
        loss = alloc.malloc(4, 0, loss_stack)
        if oom_at == "forward":
            alloc.malloc(tokens * vocab * 4 * 8, 0, loss_stack)
        # backward on the autograd engine thread
        if len(workspaces) == 1:
            workspaces.append(alloc.malloc(8519680, 0, workspace_bwd))
        g = alloc.malloc(tokens * vocab * 4, 0, bwd("NllLossBackward0"))
        alloc.free(loss)
        alloc.free(logp)
        g2 = alloc.malloc(tokens * vocab * 4, 0, bwd("LogSoftmaxBackward0"))
        alloc.free(g)
        alloc.free(logits)
        for name in ("lm_head", "down", "up", "o", "qkv", "norm", "embed"):
            if name not in grads:
                grads[name] = alloc.malloc(params[name], 0, accumulate)
            if saved:
                gi = alloc.malloc(act, 0, bwd("MmBackward0"))
                alloc.free(saved.pop())
                alloc.free(gi)
        alloc.free(g2)
        while saved:
            alloc.free(saved.pop())
        # a gradient bucket copied on a side stream (a communication buffer)
        bucket = alloc.malloc(4 * MiB, side_stream, fr.stack(
            ("all_reduce", f"{TORCH}/distributed/distributed_c10d.py", 2501), loop))
        alloc.free(bucket)
        # optimizer: AdamW creates its state on the first step
        if oom_at == "optimizer" and step == 1:
            for name in params:
                state[name] = (alloc.malloc(params[name], 0, opt_init), alloc.malloc(params[name], 0, opt_init))
        if not state:
            for name in params:
                state[name] = (alloc.malloc(params[name], 0, opt_init), alloc.malloc(params[name], 0, opt_init))
        temps = [alloc.malloc(params[name], 0, opt_tmp) for name in ("embed", "up", "lm_head")]
        for t in temps:
            alloc.free(t)
        for name in list(grads):
            alloc.free(grads.pop(name), zero_grad)
        alloc.free(x)
        if step == 1:
            alloc.empty_cache()  # torch.cuda.empty_cache() after the first step


def build_snapshot(alloc, s, empty_frames, settings=True):
    snap = {"segments": alloc.snapshot_segments(s, empty_frames),
            "device_traces": [alloc.trace]}
    if settings:
        roundup = {str(1 << i): 0 for i in range(16)}
        snap["allocator_settings"] = {
            "PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
            "garbage_collection_threshold": 0.0, "expandable_segments": False,
            "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False, "roundup_power2_divisions": roundup}
        snap["external_annotations"] = []
    return snap


def training_snapshot(limit=1 << 62, oom_at=None, steps=2):
    s = strings()
    alloc = MiniAllocator(limit, s)
    fr = Frames(s)
    try:
        run_training(alloc, fr, steps=steps, oom_at=oom_at)
    except OutOfMemory:
        pass
    return build_snapshot(alloc, s, [], settings=True), alloc


# The structure of each generation of THCPModule_memorySnapshot
# (torch/csrc/cuda/Module.cpp), as docs/snapshot.md "Structure by release"
# lists it with its sources. The same run in each, so the measured peaks are
# the same (torch1_13 has no trace: the state at the end only).
def layout_snapshot(snap, layout):
    segments = snap["segments"]
    trace = snap["device_traces"][0]

    def old_segments(requested):
        # torch <= 2.0: blocks carry "history" (the allocation's addr,
        # real_size and frames) instead of "address" and "frames"; segments
        # have neither "frames", "is_expandable" nor "segment_pool_id".
        out = []
        for seg in segments:
            blocks = []
            for b in seg["blocks"]:
                d = {"size": b["size"], "state": b["state"]}
                if requested:
                    d["requested_size"] = b["requested_size"]
                if b["state"] != "inactive":
                    h = {"addr": b["address"], "real_size": b["requested_size"]}
                    if b["frames"]:
                        h["frames"] = b["frames"]
                    d["history"] = [h]
                blocks.append(d)
            d = {k: seg[k] for k in ("device", "address", "total_size", "allocated_size",
                                     "active_size", "stream", "segment_type")}
            if requested:
                d["requested_size"] = seg["requested_size"]
            d["blocks"] = blocks
            out.append(d)
        return out

    def entries(keep_time, extra):
        out = []
        for i, e in enumerate(trace):
            d = {k: v for k, v in e.items() if keep_time or k != "time_us"}
            d.update(extra)
            out.append(d)
        return out

    if layout == "torch1_13":
        # _snapshot() returned the list of segments (no trace yet).
        return old_segments(requested=False)
    if layout == "torch2_0":
        old = entries(keep_time=False, extra={})
        for d in old:  # stacks="all": C++ frames as a list of str beside "frames"
            if "frames" in d:
                d["cpp_frames"] = ["at::native::empty_cuda"]
        return {"segments": old_segments(requested=True), "device_traces": [old]}
    if layout == "torch2_1":
        return {"segments": segments, "device_traces": [entries(keep_time=False, extra={})]}
    if layout == "newest":
        new = entries(keep_time=True, extra={"compile_context": "N/A", "user_metadata": "",
                                             "pool_id": (0, 0)})
        # An annotate action (unknown to this reader: kept, ignored) mid-trace.
        mid = len(new) // 2
        new.insert(mid, {"action": "annotate", "addr": new[mid]["addr"] if "addr" in new[mid]
                         else 0, "size": 0, "stream": 0, "time_us": new[mid]["time_us"],
                         "frames": [], "compile_context": "N/A",
                         "user_metadata": '{"retained_by": "autograd"}', "pool_id": (0, 0)})
        settings = dict(snap["allocator_settings"])
        settings["graph_capture_record_stream_reuse"] = False
        return {"segments": segments, "device_traces": [new], "allocator_settings": settings,
                "external_annotations": [{"stage": "START", "name": "## forward ##",
                                          "device": 0, "time_us": 1700000000000000}]}
    raise ValueError(layout)


LAYOUTS = ("torch1_13", "torch2_0", "torch2_1", "newest")


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def values_document():
    """Every value kind the reader supports, each once, plus shared parts."""
    shared = ["shared", 1]
    return {
        "none": None, "true": True, "false": False,
        "ints": [0, 1, 255, 256, 65535, 65536, -1, -2 ** 31, 2 ** 31 - 1, 2 ** 31, -2 ** 31 - 1,
                 2 ** 59 - 1, 2 ** 59, -2 ** 59, -2 ** 59 - 1, 2 ** 63 - 1, -2 ** 63, 2 ** 64 - 1,
                 2 ** 64, -2 ** 64, 2 ** 200, 2 ** 2100],
        "float": 0.1, "neg_float": -2.5e300,
        "short_str": "abc", "long_str": "x" * 300, "unicode": "\u00e9\u4e2d\U0001F600",
        "empty_list": [], "empty_dict": {}, "empty_tuple": (),
        "tuple1": (1,), "tuple2": (1, 2), "tuple3": (1, 2, 3), "tuple4": (1, 2, 3, 4),
        "nested": {"a": [{"b": (None, [True])}]},
        "big_list": [i % 200 for i in range(1100)],   # > 1000: several APPENDS batches
        "big_dict": {i: i % 200 for i in range(1001)},  # > 1000: several SETITEMS batches
        "shared_a": shared, "shared_b": shared,
        "dup_key_order": 1,
    }


def hostile_files():
    p4 = b"\x80\x04"
    files = {
        # GLOBAL + REDUCE: os.system("echo pwned") in protocol 0 text form.
        "global_reduce.pickle": b"cos\nsystem\n(S'echo pwned'\ntR.",
        # The same through protocol 4's STACK_GLOBAL.
        "stack_global.pickle": pickle.dumps(__import__("collections").OrderedDict(a=1), protocol=4),
        # builtins.eval called via REDUCE.
        "reduce_eval.pickle": p4 + b"\x8c\x08builtins\x8c\x04eval\x93\x8c\x041+1\x85R.",
        # An object instance: NEWOBJ + BUILD.
        "newobj_build.pickle": pickle.dumps(OutOfMemory(1), protocol=4),
        "persid.pickle": p4 + b"Pfile\n.",
        "binpersid.pickle": p4 + b"K\x01Q.",
        "ext1.pickle": p4 + b"\x82\x01.",
        "inst.pickle": b"\x80\x02(ios\nsystem\nS'x'\n.",
        "unknown_opcode.pickle": p4 + b"\xff.",
        "bad_protocol.pickle": b"\x80\x09N.",
        "no_stop.pickle": p4 + b"}\x94",
        "empty.pickle": b"",
        "garbage.bin": bytes((i * 37 + 11) % 256 for i in range(512)),
        "text_protocol0.pickle": b"(lp0\nI1\na.",
        # 20000 nested lists: ']' x N then APPEND x (N-1).
        "deep_nesting.pickle": p4 + b"]" * 20000 + b"a" * 19999 + b".",
        "mark_bomb.pickle": p4 + b"(" * 50000 + b"N.",
        "huge_string_length.pickle": p4 + b"\x8d" + struct.pack("<Q", 1 << 60) + b"abc.",
        "huge_binunicode.pickle": p4 + b"X" + struct.pack("<I", 0xFFFFFFF0) + b"abc.",
        "huge_long4.pickle": p4 + b"\x8b" + struct.pack("<i", 0x7FFFFFF0) + b"\x01.",
        "huge_frame.pickle": p4 + b"\x95" + struct.pack("<Q", 1 << 40) + b"N.",
        "huge_memo_get.pickle": p4 + b"N\x94j" + struct.pack("<I", 0xFFFFFFFF) + b".",
        "sparse_memo_put.pickle": p4 + b"Nr" + struct.pack("<I", 0xFFFFFFFE) + b"0h\x05.",
        # A list that contains itself, through the memo.
        "memo_cycle_list.pickle": p4 + b"]\x94h\x00a.",
        # A dict whose value is the dict.
        "memo_cycle_dict.pickle": p4 + b"}\x94\x8c\x01ah\x00s.",
        # Two lists containing each other.
        "memo_cycle_pair.pickle": p4 + b"]\x94]\x94h\x00aa.",
        "stack_underflow.pickle": p4 + b"a.",
        "setitems_odd.pickle": p4 + b"}(Nu.",
        "append_to_dict.pickle": p4 + b"}Na.",
        "pop_empty.pickle": p4 + b"0.",
        "truncated_long1.pickle": p4 + b"\x8a\x08\x01\x02",
        "wrong_root.pickle": pickle.dumps(42, protocol=4),
        "not_a_snapshot.pickle": pickle.dumps({"hello": "world"}, protocol=4),
        "segments_not_list.pickle": pickle.dumps({"segments": 5, "device_traces": []}, protocol=4),
        "negative_size.pickle": pickle.dumps({"segments": [], "device_traces": [[
            {"action": "alloc", "addr": 1, "size": -5, "stream": 0}]]}, protocol=4),
        "size_too_big.pickle": pickle.dumps({"segments": [], "device_traces": [[
            {"action": "alloc", "addr": 1, "size": 2 ** 70, "stream": 0}]]}, protocol=4),
        "missing_action.pickle": pickle.dumps({"segments": [], "device_traces": [[
            {"addr": 1, "size": 5, "stream": 0}]]}, protocol=4),
        "bad_block_sum.pickle": pickle.dumps({"segments": [{
            "device": 0, "address": 0, "total_size": 100, "stream": 0, "segment_type": "large",
            "blocks": [{"size": 50, "state": "inactive"}]}], "device_traces": []}, protocol=4),
        "bad_state.pickle": pickle.dumps({"segments": [{
            "device": 0, "address": 0, "total_size": 100, "stream": 0,
            "blocks": [{"size": 100, "state": "haunted"}]}], "device_traces": []}, protocol=4),
        "frames_not_dicts.pickle": pickle.dumps({"segments": [], "device_traces": [[
            {"action": "alloc", "addr": 1, "size": 5, "stream": 0, "frames": [1, 2]}]]}, protocol=4),
        # A trace entry dict filled again after it was complete (SETITEMS twice).
        "entry_filled_twice.pickle": p4 + b"}(\x8c\x06action\x8c\x05alloc\x8c\x04addrK\x01"
                                          b"\x8c\x04sizeK\x02u(\x8c\x01xK\x03u.",
        # A dict that reads as a trace entry where a segment belongs.
        "entry_as_segment.pickle": pickle.dumps({"segments": [
            {"action": "alloc", "addr": 1, "size": 2}], "device_traces": []}, protocol=4),
        "malformed.json": b'{"segments": [}',
        "truncated.json": b'{"segments": [], "device_traces": [[{"action": "alloc", "addr": 1',
        "deep.json": b"[" * 20000 + b"]" * 20000,
        "wrong_type.json": b'{"segments": [], "device_traces": [[{"action": 7, "addr": 1, "size": 2}]]}',
    }
    return files


def main():
    os.makedirs(OUT, exist_ok=True)
    snap, alloc = training_snapshot()
    print(f"train: {len(alloc.trace)} trace entries, peak allocated {alloc.peak_allocated}, "
          f"peak reserved {alloc.peak_reserved}")
    for proto in (2, 4, 5):
        write(os.path.join(OUT, f"train_p{proto}.pickle"), pickle.dumps(snap, protocol=proto))
    # JSON (no memo: frames repeat in full), of a one-step run to stay small,
    # with a pickle twin so tests can check that both read the same.
    one, _ = training_snapshot(steps=1)
    write(os.path.join(OUT, "train_1step.json"), json.dumps(one, separators=(",", ":")).encode())
    write(os.path.join(OUT, "train_1step_p4.pickle"), pickle.dumps(one, protocol=4))
    # Measured numbers of the run, for the end-to-end tests.
    facts = {"train": {"peak_reserved_bytes": alloc.peak_reserved,
                       "peak_allocated_bytes": alloc.peak_allocated}}

    # The same run seen through a small ring buffer: only the last entries.
    wrapped = dict(snap)
    wrapped["device_traces"] = [alloc.trace[-150:]]
    write(os.path.join(OUT, "wrapped.pickle"), pickle.dumps(wrapped, protocol=4))

    # A run that runs out of memory while AdamW creates its state.
    oom, oom_alloc = training_snapshot(limit=420 * MiB, oom_at="optimizer", steps=1)
    write(os.path.join(OUT, "oom.pickle"), pickle.dumps(oom, protocol=4))
    facts["oom"] = {"peak_reserved_bytes": oom_alloc.peak_reserved,
                    "peak_allocated_bytes": oom_alloc.peak_allocated, "limit_bytes": 420 * MiB}

    # The same run in the structure of each torch generation.
    for layout in LAYOUTS:
        write(os.path.join(OUT, f"{layout}.pickle"),
              pickle.dumps(layout_snapshot(snap, layout), protocol=4))

    # torch.cuda.memory_snapshot() returns the segments alone.
    write(os.path.join(OUT, "segments_only.pickle"), pickle.dumps(snap["segments"], protocol=4))

    # Value coverage for the reader's unit tests.
    values = values_document()
    for proto in (2, 3, 4, 5):
        doc = dict(values)
        if proto >= 3:
            doc["bytes"] = b"\x00\x01binary"
            doc["long_bytes"] = b"b" * 300
        if proto >= 5:
            doc["bytearray"] = bytearray(b"ba")
        write(os.path.join(OUT, f"values_p{proto}.pickle"), pickle.dumps(doc, protocol=proto))
    with open(os.path.join(OUT, "facts.json"), "w") as f:
        json.dump(facts, f, indent=1, sort_keys=True)
        f.write("\n")

    os.makedirs(BAD, exist_ok=True)
    for name, data in hostile_files().items():
        write(os.path.join(BAD, name), data)
    # Truncated copies of a real snapshot (half, and cut inside the first entry).
    full = pickle.dumps(snap, protocol=4)
    write(os.path.join(BAD, "truncated_half.pickle"), full[: len(full) // 2])
    write(os.path.join(BAD, "truncated_early.pickle"), full[:100])

    os.makedirs(CORPUS, exist_ok=True)
    small, _ = training_snapshot(steps=1)
    small["device_traces"] = [small["device_traces"][0][:40]]
    write(os.path.join(CORPUS, "train_small_p4.pickle"), pickle.dumps(small, protocol=4))
    write(os.path.join(CORPUS, "train_small_p2.pickle"), pickle.dumps(small, protocol=2))
    write(os.path.join(CORPUS, "train_small.json"), json.dumps(small).encode())
    write(os.path.join(CORPUS, "values_p5.pickle"), pickle.dumps(values_document(), protocol=5))
    for layout in LAYOUTS:
        seed = layout_snapshot(small, layout)
        write(os.path.join(CORPUS, f"layout_{layout}.pickle"), pickle.dumps(seed, protocol=4))
    for name, data in hostile_files().items():
        if len(data) < 4096:
            write(os.path.join(CORPUS, "bad_" + name), data)


if __name__ == "__main__":
    main()
