"""TEST MODEL's CUDA path -- not FasterTransformer. A small GPT-like decoder that really computes.

model.py imports this only when torch is importable and CUDA is available; otherwise the test
model stays the CPU stand-in. What it imitates of FT's GPT (src/fastertransformer/models/
multi_gpu_gpt, as driven by the FT backend):
- dimensions from the checkpoint's config.ini (head_num, size_per_head, inter_size, num_layer,
  vocab_size, max_pos_seq_len); the weights are NOT read from shards: they are made from a seed
  (deterministic, on the CPU, so every plan and every machine gets the same numbers);
- one process per node drives the node's tensor_para_size GPUs (FT: one thread per GPU; here one
  thread issues every GPU's kernels and NCCL group calls), tensor parallelism as Megatron/FT
  (attention heads and the MLP's inner dimension split, NCCL all-reduce after each row-parallel
  matmul), pipeline parallelism across nodes (num_layer / pipeline_para_size layers per node,
  NCCL send/recv between stages, the last stage's tokens broadcast back);
- NCCL communicators as FT makes them: the unique id comes from rank 0 over the MPI world
  (ctmpi's broadcast), ncclCommInitRank inside a group call for a node's GPUs.
Greedy decoding, no KV cache (each step recomputes the sequence), no early stop at end_id.
"""

import ctypes
import ctypes.util
import glob
import math
import os

import numpy as np
import torch

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_NCCL_TYPES = {torch.float32: 7, torch.float16: 6, torch.bfloat16: 9, torch.int64: 4}
_NCCL_SUM = 0


def cuda_available():
    return torch.cuda.is_available()


def visible_gpus():
    """What the process may use: CUDA_VISIBLE_DEVICES already applied by the CUDA runtime."""
    return torch.cuda.device_count()


class Dims:
    def __init__(self, ini, section):
        get = ini.getint
        self.head_num = get(section, "head_num")
        self.size_per_head = get(section, "size_per_head")
        self.hidden = self.head_num * self.size_per_head
        self.inter = get(section, "inter_size", fallback=4 * self.hidden)
        self.layers = get(section, "num_layer")
        self.vocab = get(section, "vocab_size")
        self.max_pos = get(section, "max_pos_seq_len", fallback=2048)

    def __repr__(self):
        return (f"head_num={self.head_num} size_per_head={self.size_per_head} inter_size={self.inter} "
                f"num_layer={self.layers} vocab_size={self.vocab} max_pos_seq_len={self.max_pos}")


def _randn(seed, key, shape, std):
    gen = torch.Generator().manual_seed((seed * 1_000_003 + key) % (2 ** 63))
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def layer_weights(dims, seed, layer):
    """The full (unsharded) weights of one layer; std 1/sqrt(fan_in) so every layer matters."""
    h, i = dims.hidden, dims.inter
    k = 1000 * (layer + 1)
    return {
        "ln1_w": 1.0 + _randn(seed, k + 1, (h,), 0.1), "ln1_b": _randn(seed, k + 2, (h,), 0.1),
        "wq": _randn(seed, k + 3, (h, h), h ** -0.5), "wk": _randn(seed, k + 4, (h, h), h ** -0.5),
        "wv": _randn(seed, k + 5, (h, h), h ** -0.5),
        "bq": _randn(seed, k + 6, (h,), 0.1), "bk": _randn(seed, k + 7, (h,), 0.1),
        "bv": _randn(seed, k + 8, (h,), 0.1),
        "wo": _randn(seed, k + 9, (h, h), h ** -0.5), "bo": _randn(seed, k + 10, (h,), 0.1),
        "ln2_w": 1.0 + _randn(seed, k + 11, (h,), 0.1), "ln2_b": _randn(seed, k + 12, (h,), 0.1),
        "w1": _randn(seed, k + 13, (h, i), h ** -0.5), "b1": _randn(seed, k + 14, (i,), 0.1),
        "w2": _randn(seed, k + 15, (i, h), i ** -0.5), "b2": _randn(seed, k + 16, (h,), 0.1),
    }


def shard_layer(full, dims, tp, part):
    """GPU `part` of `tp`: q/k/v and w1 split by columns (heads, inner dim), wo and w2 by rows."""
    h, i = dims.hidden, dims.inter
    hs, ish = slice(part * h // tp, (part + 1) * h // tp), slice(part * i // tp, (part + 1) * i // tp)
    out = {key: full[key] for key in ("ln1_w", "ln1_b", "bo", "ln2_w", "ln2_b", "b2")}
    for key in ("wq", "wk", "wv"):
        out[key] = full[key][:, hs]
    for key in ("bq", "bk", "bv"):
        out[key] = full[key][hs]
    out["wo"], out["w1"], out["b1"], out["w2"] = full["wo"][hs, :], full["w1"][:, ish], full["b1"][ish], full["w2"][ish, :]
    return out


def embedding_weights(dims, seed):
    # An untied output head (FT loads model.lm_head.weight.bin when a checkpoint has one): with
    # untrained weights a head tied to wte scores the current token highest, so every plan just
    # repeats the prompt's last token and an identity test across plans could not fail.
    return {"wte": _randn(seed, 1, (dims.vocab, dims.hidden), 1.0),
            "wpe": _randn(seed, 2, (dims.max_pos, dims.hidden), 0.5),
            "lnf_w": 1.0 + _randn(seed, 3, (dims.hidden,), 0.1), "lnf_b": _randn(seed, 4, (dims.hidden,), 0.1),
            "lm_head": _randn(seed, 5, (dims.vocab, dims.hidden), dims.hidden ** -0.5)}


class Stage:
    """One pipeline stage (node): its layers on each of its tp devices. Communication is passed in."""

    def __init__(self, dims, seed, tp, pp, stage, devices, dtype):
        if dims.layers % pp:
            raise RuntimeError(f"[FT][ERROR] num_layer {dims.layers} must be divisible by pipeline_para_size {pp}")
        if dims.head_num % tp or dims.inter % tp:
            raise RuntimeError(f"[FT][ERROR] head_num {dims.head_num} and inter_size {dims.inter} must be "
                               f"divisible by tensor_para_size {tp}")
        self.dims, self.tp, self.pp, self.stage = dims, tp, pp, stage
        self.devices, self.dtype = devices, dtype
        per = dims.layers // pp
        self.layer_ids = list(range(stage * per, (stage + 1) * per))
        self.layers = [[] for _ in devices]   # [gpu][layer] -> dict of tensors
        for layer in self.layer_ids:
            full = layer_weights(dims, seed, layer)
            for g, dev in enumerate(devices):
                self.layers[g].append({k: v.to(dev, dtype).contiguous()
                                       for k, v in shard_layer(full, dims, tp, g).items()})
        emb = embedding_weights(dims, seed)
        self.first, self.last = stage == 0, stage == pp - 1
        self.emb = [{k: v.to(dev, dtype) for k, v in emb.items()} if (self.first or self.last) else None
                    for dev in devices]

    def embed(self, ids):
        """ids: [B, T] int64 on the CPU -> one replica of the hidden states per device."""
        t = ids.shape[1]
        return [e["wte"][ids.to(dev)] + e["wpe"][:t].unsqueeze(0) for e, dev in zip(self.emb, self.devices)]

    def forward(self, hs, allreduce):
        """hs: [B, T, H] per device (replicas); allreduce(list) sums the list across the tp devices."""
        nh = self.dims.head_num // self.tp
        d = self.dims.size_per_head
        for li in range(len(self.layer_ids)):
            parts = []
            for g, h in enumerate(hs):
                w = self.layers[g][li]
                x = torch.nn.functional.layer_norm(h, (h.shape[-1],), w["ln1_w"], w["ln1_b"])
                b, t, _ = x.shape
                q, k, v = ((x @ w[n] + w["b" + n[1]]).view(b, t, nh, d).transpose(1, 2) for n in ("wq", "wk", "wv"))
                scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
                mask = torch.ones(t, t, dtype=torch.bool, device=h.device).triu(1)
                att = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
                parts.append(att.transpose(1, 2).reshape(b, t, nh * d) @ w["wo"])
            allreduce(parts)
            hs = [h + p + self.layers[g][li]["bo"] for g, (h, p) in enumerate(zip(hs, parts))]
            parts = []
            for g, h in enumerate(hs):
                w = self.layers[g][li]
                x = torch.nn.functional.layer_norm(h, (h.shape[-1],), w["ln2_w"], w["ln2_b"])
                parts.append(torch.nn.functional.gelu(x @ w["w1"] + w["b1"]) @ w["w2"])
            allreduce(parts)
            hs = [h + p + self.layers[g][li]["b2"] for g, (h, p) in enumerate(zip(hs, parts))]
        return hs

    def next_tokens(self, h, positions):
        """Greedy tokens at positions[b] of each row (first device's replica), [B] int64."""
        e = self.emb[0]
        rows = h[torch.arange(h.shape[0], device=h.device), positions.to(h.device)]
        x = torch.nn.functional.layer_norm(rows, (rows.shape[-1],), e["lnf_w"], e["lnf_b"])
        return torch.argmax((x @ e["lm_head"].T).float(), dim=-1)


def generate(step_fn, ids, in_lens, out_lens):
    """The decoding loop shared by every plan: step_fn(ids [B, T], positions [B]) -> tokens [B]."""
    batch = ids.shape[0]
    max_out = int(out_lens.max()) if out_lens.size else 0
    buf = torch.zeros((batch, int((in_lens + out_lens).max()) if batch else 0), dtype=torch.int64)
    for b in range(batch):
        buf[b, : int(in_lens[b])] = torch.from_numpy(ids[b, : int(in_lens[b])].astype(np.int64))
    out = np.zeros((batch, max_out), dtype=np.int64)
    cur = torch.from_numpy(in_lens.astype(np.int64))
    for step in range(max_out):
        t = int(cur.max())
        tokens = step_fn(buf[:, :t], cur - 1).cpu()
        for b in range(batch):
            if step < int(out_lens[b]):
                buf[b, int(cur[b])] = tokens[b]
                out[b, step] = int(tokens[b])
        cur = cur + torch.from_numpy((step < out_lens).astype(np.int64))
    return out


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def _find_libnccl():
    with open("/proc/self/maps") as fh:     # the libnccl torch already loaded, if any
        for line in fh:
            if "libnccl.so" in line:
                return line.split()[-1]
    roots = [os.path.dirname(os.path.dirname(torch.__file__))]
    for root in roots:
        hits = sorted(glob.glob(os.path.join(root, "nvidia", "**", "libnccl.so*"), recursive=True))
        if hits:
            return hits[0]
    found = ctypes.util.find_library("nccl")
    if found:
        return found
    raise RuntimeError("[FT][ERROR] no libnccl found (torch's, nvidia-nccl's or the linker's)")


class Nccl:
    """The NCCL calls FT makes, through ctypes on the libnccl torch uses."""

    def __init__(self):
        self.lib = ctypes.CDLL(_find_libnccl(), mode=ctypes.RTLD_GLOBAL)
        v, p, i, s = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_size_t
        sig = {"ncclCommInitRank": [p, i, _UniqueId, i], "ncclCommInitAll": [p, i, ctypes.POINTER(i)],
               "ncclAllReduce": [v, v, s, i, i, v, v], "ncclBroadcast": [v, v, s, i, i, v, v],
               "ncclSend": [v, s, i, i, v, v], "ncclRecv": [v, s, i, i, v, v],
               "ncclGetUniqueId": [ctypes.POINTER(_UniqueId)], "ncclGroupStart": [], "ncclGroupEnd": [],
               "ncclCommDestroy": [v]}
        for name, args in sig.items():
            getattr(self.lib, name).argtypes = args
            getattr(self.lib, name).restype = ctypes.c_int
        self.lib.ncclGetErrorString.restype = ctypes.c_char_p
        self.lib.ncclGetErrorString.argtypes = [ctypes.c_int]

    def check(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise RuntimeError(f"[FT][ERROR] NCCL {name} failed: {self.lib.ncclGetErrorString(rc).decode()}")

    def unique_id(self):
        uid = _UniqueId()
        self.check("ncclGetUniqueId", ctypes.byref(uid))
        return bytes(bytearray(uid.internal))

    def init_all(self, ndev):
        comms = (ctypes.c_void_p * ndev)()
        devs = (ctypes.c_int * ndev)(*range(ndev))
        self.check("ncclCommInitAll", comms, ndev, devs)
        return list(comms)

    def init_ranks(self, uids, nranks, rank):
        """One communicator per local GPU g (uids[g]), this process being `rank` in each."""
        comms = []
        self.check("ncclGroupStart")
        for g, raw in enumerate(uids):
            uid = _UniqueId()
            ctypes.memmove(ctypes.addressof(uid), raw, 128)
            comm = ctypes.c_void_p()
            torch.cuda.set_device(g)
            self.check("ncclCommInitRank", ctypes.byref(comm), nranks, uid, rank)
            comms.append(comm)
        self.check("ncclGroupEnd")
        return [c.value for c in comms]

    @staticmethod
    def _stream(t):
        return torch.cuda.current_stream(t.device).cuda_stream

    def allreduce(self, tensors, comms):
        self.check("ncclGroupStart")
        for t, comm in zip(tensors, comms):
            self.check("ncclAllReduce", t.data_ptr(), t.data_ptr(), t.numel(), _NCCL_TYPES[t.dtype],
                       _NCCL_SUM, comm, self._stream(t))
        self.check("ncclGroupEnd")

    def send_recv(self, tensors, comms, peer, send):
        self.check("ncclGroupStart")
        for t, comm in zip(tensors, comms):
            op = "ncclSend" if send else "ncclRecv"
            self.check(op, t.data_ptr(), t.numel(), _NCCL_TYPES[t.dtype], peer, comm, self._stream(t))
        self.check("ncclGroupEnd")

    def broadcast(self, t, comm, root):
        self.check("ncclBroadcast", t.data_ptr(), t.data_ptr(), t.numel(), _NCCL_TYPES[t.dtype], root, comm,
                   self._stream(t))

    def destroy(self, comms):
        for comm in comms:
            self.lib.ncclCommDestroy(comm)


class Engine:
    """This node's stage on its tp GPUs, joined to the other nodes' stages over NCCL."""

    def __init__(self, world, dims, tp, pp, data_type, seed):
        if pp != world.size:
            raise RuntimeError(f"test model (CUDA): pipeline_para_size {pp} must equal the number of ranks "
                               f"{world.size} (one pipeline stage per node)")
        if data_type not in _DTYPES:
            raise RuntimeError(f"test model (CUDA): data_type {data_type!r} not one of {sorted(_DTYPES)}")
        # Bit-for-bit plans: no TF32 (its rounding would differ between split and whole matmuls).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.world, self.tp, self.pp, self.rank = world, tp, pp, world.rank
        devices = [torch.device("cuda", g) for g in range(tp)]
        self.stage = Stage(dims, seed, tp, pp, world.rank, devices, _DTYPES[data_type])
        self.nccl = Nccl() if tp > 1 or pp > 1 else None
        self.tp_comms = self.nccl.init_all(tp) if tp > 1 else []
        self.pp_comms = []
        if pp > 1:
            mine = b"".join(self.nccl.unique_id() for _ in range(tp)) if world.rank == 0 else None
            raw = world.bcast_bytes(mine)
            self.pp_comms = self.nccl.init_ranks([raw[g * 128:(g + 1) * 128] for g in range(tp)], pp, world.rank)
        torch.cuda.synchronize()

    def describe(self):
        return (f"CUDA test decoder: {self.stage.dims}, stage {self.rank} of {self.pp} holds layers "
                f"{self.stage.layer_ids[0]}..{self.stage.layer_ids[-1]} on {self.tp} GPU(s) "
                f"({', '.join(torch.cuda.get_device_name(d) for d in self.stage.devices)})")

    def check(self, in_lens, out_lens):
        longest = int((in_lens + out_lens).max()) if in_lens.size else 0
        if longest > self.stage.dims.max_pos:
            raise ValueError(f"input + output length {longest} exceeds max_pos_seq_len {self.stage.dims.max_pos}")

    def _allreduce(self, parts):
        if self.tp > 1:
            self.nccl.allreduce(parts, self.tp_comms)

    def _step(self, ids, positions):
        st = self.stage
        b, t = ids.shape
        if st.first:
            hs = st.embed(ids)
        else:
            hs = [torch.empty((b, t, st.dims.hidden), dtype=st.dtype, device=d) for d in st.devices]
            self.nccl.send_recv(hs, self.pp_comms, self.rank - 1, send=False)
        hs = st.forward(hs, self._allreduce)
        if not st.last:
            self.nccl.send_recv(hs, self.pp_comms, self.rank + 1, send=True)
            tokens = torch.empty((b,), dtype=torch.int64, device=st.devices[0])
        else:
            tokens = st.next_tokens(hs[0], positions)
        if self.pp > 1:   # every stage learns the tokens (stage 0 feeds them back in)
            self.nccl.broadcast(tokens, self.pp_comms[0], self.pp - 1)
        return tokens

    def generate(self, req):
        """req: ids, in_lens, out_lens (the request rank 0 broadcast) -> generated [B, max_out]."""
        with torch.no_grad():
            return generate(self._step, req["ids"], req["in_lens"], req["out_lens"])
