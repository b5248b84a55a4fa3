"""Real torch kernels for SimpleX/CCL training: a baseline step and a HEAT-style tiled step.

Both compute the same loss on the same parameters (``CFParams``)::

    p_u = g·e_u + (1 − g)·(W · mean_h e_h)
    L   = (1/B) Σ_b [ relu(1 − cos(p_b, e_pos_b)) + (w/n) Σ_j relu(cos(p_b, e_neg_bj) − m) ]

* ``baseline_step`` is SimpleX as commonly written in PyTorch (reczoo/RecZoo SimpleX, RecBole):
  gather every row into dense batch tensors (the negatives become a B×n×d copy), normalize,
  ``bmm`` the similarities, ``loss.backward()`` with dense embedding gradients, ``torch.optim``.
* ``tiled_step`` follows HEAT (ICS'23 §4.2-4.4): each of T threads owns a tile of N1 item ids
  drawn uniformly at random and redrawn every N2 of its iterations; negatives are drawn from the
  tile. Similarities are batched vector products of the thread's users against its tile rows
  (one b×N1 block per thread, ``bmm``); a negative selects a *scalar* from that block, so no
  B×n×d gathered copy exists. The backward is written by hand: it reuses the forward's norms,
  normalized vectors and cosines, scatters the negative gradients back onto the tile, and the
  update touches only the rows that were read (sparse SGD or lazy row-wise Adam).

Departure from HEAT: HEAT runs one OpenMP thread per sample stream in C++; here the T per-thread
tiles are the batch dimension of ``bmm`` and torch's intra-op threads run them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from paraplan.cf.model import CFModel
from paraplan.cf.data import CFData, user_histories

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


@dataclass
class CFParams:
    """Trainable tensors: user table (U×d), item table (I×d), aggregator W (d×d)."""
    user: torch.Tensor
    item: torch.Tensor
    W: torch.Tensor
    state: dict = field(default_factory=dict)  # optimizer state of the tiled path

    def clone(self) -> "CFParams":
        return CFParams(self.user.detach().clone(), self.item.detach().clone(), self.W.detach().clone())


def init_params(model: CFModel, seed: int = 0) -> CFParams:
    """N(0, 0.1²) embeddings and an identity-plus-noise W (SimpleX initializes small normals)."""
    g = torch.Generator().manual_seed(seed)
    d = model.dim
    user = torch.randn(model.users, d, generator=g) * 0.1
    item = torch.randn(model.items, d, generator=g) * 0.1
    W = torch.eye(d) + torch.randn(d, d, generator=g) * 0.01
    return CFParams(user, item, W)


# ---------------------------------------------------------------- loss (shared definition)

def ccl_loss(pos_cos: torch.Tensor, neg_cos: torch.Tensor, margin: float, weight: float) -> torch.Tensor:
    """Mean over the batch of relu(1 − pos) + (w/n)·Σ_j relu(neg_j − m) (HEAT Eq. 3; RecZoo
    ``CosineContrastiveLoss`` with ``negative_weight`` w)."""
    n = neg_cos.shape[-1]
    return (torch.relu(1 - pos_cos) + torch.relu(neg_cos - margin).sum(-1) * (weight / n)).mean()


def user_vectors(params: CFParams, users, hist, gate: float) -> torch.Tensor:
    """p_u = g·e_u + (1 − g)·mean(e_hist)·Wᵀ, or e_u when no aggregation."""
    e = F.embedding(users, params.user)
    if hist is None or gate >= 1.0:
        return e
    return gate * e + (1 - gate) * (F.embedding(hist, params.item).mean(1) @ params.W.T)


def reference_loss(params: CFParams, users, pos, negs, hist, model: CFModel) -> torch.Tensor:
    """The loss by autograd-able torch ops on explicit negative ids (B×n); the baseline's math."""
    p = F.normalize(user_vectors(params, users, hist, model.gate), dim=-1)
    ep = F.normalize(F.embedding(pos, params.item), dim=-1)
    en = F.normalize(F.embedding(negs, params.item), dim=-1)   # the B×n×d gathered copy
    pos_cos = (p * ep).sum(-1)
    neg_cos = torch.bmm(en, p.unsqueeze(-1)).squeeze(-1)
    return ccl_loss(pos_cos, neg_cos, model.margin, model.negative_weight)


# ---------------------------------------------------------------- baseline

def make_baseline_optimizer(params: CFParams, model: CFModel) -> torch.optim.Optimizer:
    tensors = [params.user, params.item, params.W]
    for t in tensors:
        t.requires_grad_(True)
    if model.optimizer == "adam":
        return torch.optim.Adam(tensors, lr=model.learning_rate)
    return torch.optim.SGD(tensors, lr=model.learning_rate)


def baseline_step(params: CFParams, opt: torch.optim.Optimizer, users, pos, negs, hist, model: CFModel) -> float:
    """One SimpleX step as commonly written: dense gathers, bmm similarities, autograd, dense grads."""
    loss = reference_loss(params, users, pos, negs, hist, model)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


# ---------------------------------------------------------------- tiled (HEAT-style)

def _normalize(x: torch.Tensor):
    """(x/‖x‖, ‖x‖) with F.normalize's eps clamp."""
    nrm = x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return x / nrm, nrm


def _normalize_backward(dy: torch.Tensor, y: torch.Tensor, nrm: torch.Tensor) -> torch.Tensor:
    """d(x/‖x‖): (dy − y·⟨y, dy⟩)/‖x‖, reusing the forward's y and ‖x‖."""
    return (dy - y * (y * dy).sum(-1, keepdim=True)) / nrm


@dataclass
class TiledGrads:
    """Row gradients of a tiled step: (ids, rows) pairs per table plus dW."""
    loss: float
    user_ids: torch.Tensor
    user_rows: torch.Tensor
    item_ids: torch.Tensor
    item_rows: torch.Tensor
    dW: torch.Tensor | None

    def dense(self, params: CFParams):
        """Gradients as full-size tensors (for comparison with autograd)."""
        du = torch.zeros_like(params.user).index_add_(0, self.user_ids, self.user_rows)
        di = torch.zeros_like(params.item).index_add_(0, self.item_ids, self.item_rows)
        dW = self.dW if self.dW is not None else torch.zeros_like(params.W)
        return du, di, dW


@torch.no_grad()
def tiled_forward_backward(params: CFParams, users, pos, hist, tiles, neg_local, model: CFModel) -> TiledGrads:
    """Forward and hand-written backward of the tiled step.

    ``tiles`` is T×N1 item ids; the batch's B = T·b iterations are split in T contiguous chunks,
    chunk t drawing its negatives ``neg_local[t·b:(t+1)·b]`` (indices into tile t, B×n).
    """
    T, N1 = tiles.shape
    B, n = neg_local.shape
    b = B // T
    g, m, w = model.gate, model.margin, model.negative_weight
    agg = hist is not None and g < 1.0
    eu = params.user[users]
    if agg:
        hmean = params.item[hist].mean(1)
        pu = g * eu + (1 - g) * (hmean @ params.W.T)
    else:
        pu = eu
    un, unrm = _normalize(pu)                          # B×d, B×1
    pn, pnrm = _normalize(params.item[pos])
    X = params.item[tiles.reshape(-1)].view(T, N1, -1)  # the tile rows (cache-resident when they fit)
    xn, xnrm = _normalize(X)                            # T×N1×d
    S = torch.bmm(un.view(T, b, -1), xn.transpose(1, 2))  # T×b×N1 cosines: per-thread vector products
    idx = neg_local.view(T, b, n)
    neg_cos = S.gather(2, idx)                          # scalars only, no B×n×d copy
    pos_cos = (un * pn).sum(-1)
    pos_term = torch.relu(1 - pos_cos)
    neg_term = torch.relu(neg_cos - m)
    loss = float((pos_term + neg_term.sum(-1).view(B) * (w / n)).mean())
    # backward, reusing pos_cos, neg_cos, un, pn, xn and the norms
    dpos = torch.where(pos_cos < 1, -1.0 / B, 0.0)                       # B
    dneg = (neg_cos > m).to(S.dtype) * (w / (n * B))                     # T×b×n
    dS = torch.zeros_like(S).scatter_add_(2, idx, dneg)                  # onto the tile
    dun = dpos[:, None] * pn + torch.bmm(dS, xn).view(B, -1)
    dpn = dpos[:, None] * un
    dxn = torch.bmm(dS.transpose(1, 2), un.view(T, b, -1))               # T×N1×d
    dpu = _normalize_backward(dun, un, unrm)
    dpos_rows = _normalize_backward(dpn, pn, pnrm)
    dX = _normalize_backward(dxn, xn, xnrm).view(T * N1, -1)
    item_ids = [pos, tiles.reshape(-1)]
    item_rows = [dpos_rows, dX]
    dW = None
    if agg:
        dagg = (1 - g) * dpu
        dW = dagg.T @ hmean
        dh = (dagg @ params.W) / hist.shape[1]
        item_ids.append(hist.reshape(-1))
        item_rows.append(dh.unsqueeze(1).expand(-1, hist.shape[1], -1).reshape(-1, dh.shape[-1]))
        du = g * dpu
    else:
        du = dpu
    return TiledGrads(loss, users, du, torch.cat(item_ids), torch.cat(item_rows), dW)


def _sparse_update(table: torch.Tensor, ids, rows, lr: float, model: CFModel, state: dict, key: str) -> None:
    """SGD: table[ids] −= lr·rows (duplicates add). Adam: lazy row-wise Adam on the touched rows."""
    if model.optimizer == "sgd":
        table.index_add_(0, ids, rows, alpha=-lr)
        return
    uniq, inv = torch.unique(ids, return_inverse=True)
    gsum = torch.zeros(uniq.numel(), table.shape[1]).index_add_(0, inv, rows)
    st = state.setdefault(key, {"m": torch.zeros_like(table), "v": torch.zeros_like(table),
                                "t": torch.zeros(table.shape[0])})
    b1, b2 = ADAM_BETAS
    st["t"][uniq] += 1
    t = st["t"][uniq][:, None]
    mm = st["m"][uniq].mul_(b1).add_(gsum, alpha=1 - b1)
    vv = st["v"][uniq].mul_(b2).addcmul_(gsum, gsum, value=1 - b2)
    st["m"][uniq], st["v"][uniq] = mm, vv
    table.index_add_(0, uniq, -lr * (mm / (1 - b1 ** t)) / ((vv / (1 - b2 ** t)).sqrt() + ADAM_EPS))


@torch.no_grad()
def tiled_step(params: CFParams, users, pos, hist, tiles, neg_local, model: CFModel) -> float:
    """One tiled step: forward, hand-written backward, sparse update of the touched rows."""
    gr = tiled_forward_backward(params, users, pos, hist, tiles, neg_local, model)
    lr = model.learning_rate
    _sparse_update(params.user.data, gr.user_ids, gr.user_rows, lr, model, params.state, "user")
    _sparse_update(params.item.data, gr.item_ids, gr.item_rows, lr, model, params.state, "item")
    if gr.dW is not None:
        if model.optimizer == "sgd":
            params.W.data.add_(gr.dW, alpha=-lr)
        else:
            _sparse_update(params.W.data, torch.arange(params.W.shape[0]), gr.dW, lr, model, params.state, "W")
    return gr.loss


class TileSampler:
    """Per-thread random tiles (HEAT §4.2): T tiles of N1 ids uniform over all items, each redrawn
    after N2 of its thread's iterations; negatives uniform with replacement from the tile."""

    def __init__(self, items: int, threads: int, tile_rows: int, refresh_iterations: int, per_thread_batch: int,
                 generator: torch.Generator):
        self.items, self.T, self.N1 = items, threads, tile_rows
        self.N2, self.b, self.g = refresh_iterations, per_thread_batch, generator
        self.done = 0      # iterations per thread so far
        self.window = -1   # index of the refresh window the current tiles belong to
        self.tiles = None
        self.refreshes = 0

    def next(self, negatives: int):
        """(tiles G×N1, local negative indices T·b×n) for the next step.

        N2 ≥ b: G = T, one tile per thread, kept across steps until N2 iterations have used it.
        N2 < b (N2 must divide b): each thread's b iterations are c = b/N2 refresh windows of N2
        iterations, each with a fresh tile, so G = T·c tiles are drawn every step; group g is rows
        g·N2 .. (g+1)·N2 − 1 of the batch (thread t owns groups t·c .. (t+1)·c − 1).
        """
        if self.N2 < self.b:
            if self.b % self.N2:
                raise ValueError(f"refresh interval {self.N2} must divide the per-thread batch {self.b}")
            c = self.b // self.N2
            self.tiles = torch.randint(0, self.items, (self.T * c, self.N1), generator=self.g)
            self.refreshes += c
            self.window = -1
            self.done += self.b
            return self.tiles, torch.randint(0, self.N1, (self.T * self.b, negatives), generator=self.g)
        if self.done // self.N2 != self.window:
            self.window = self.done // self.N2
            self.tiles = torch.randint(0, self.items, (self.T, self.N1), generator=self.g)
            self.refreshes += 1
        self.done += self.b
        return self.tiles, torch.randint(0, self.N1, (self.T * self.b, negatives), generator=self.g)


# ---------------------------------------------------------------- epochs and evaluation

ALLOCATOR_WARM_BYTES = 31 * 2**20


def warm_allocator() -> None:
    """Put glibc's malloc into the state of a long-running training process: free one chunk just
    under its 32 MiB dynamic mmap-threshold ceiling (mallopt(3)), which raises the mmap threshold
    to ~32 MiB and the heap-trim threshold to ~64 MiB for the rest of the process. Without it the
    allocator's state, hence whether a kernel's multi-MiB tensors are re-faulted from the OS every
    step, depends on what the process happened to free earlier. Costs one untouched mmap/munmap."""
    t = torch.empty(ALLOCATOR_WARM_BYTES // 4)
    del t

@dataclass(frozen=True)
class EpochResult:
    """``seconds`` = the whole loop: the epoch's shuffle plus the steps; ``shuffle_seconds`` is
    the shuffle alone (a per-epoch cost, so per-step times from short runs subtract it)."""
    seconds: float
    steps: int
    mean_loss: float
    shuffle_seconds: float = 0.0
    step_times: tuple = ()

    @property
    def step_seconds(self) -> float:
        return (self.seconds - self.shuffle_seconds) / max(self.steps, 1)

    @property
    def robust_seconds(self) -> float:
        """Median step time × steps + shuffle: the epoch time without the share of it that other
        processes on a shared machine took (short intervals, like the profile's medians)."""
        if not self.step_times:
            return self.seconds
        return float(np.median(self.step_times)) * self.steps + self.shuffle_seconds


def _batches(data: CFData, model: CFModel, gen: torch.Generator, max_steps: int | None, multiple: int | None = None):
    """Shuffled batches of B interactions; a short last batch is cut to a multiple of ``multiple``
    (default T; the tiled kernel with N2 < b needs T·N2 so every refresh window is full)."""
    M = data.train_interactions
    t0 = time.perf_counter()
    perm = torch.randperm(M, generator=gen)
    yield time.perf_counter() - t0   # first item: the shuffle's seconds
    tu = torch.from_numpy(data.train_users)
    ti = torch.from_numpy(data.train_items)
    B, T = model.batch, model.threads
    q = multiple or T
    steps = 0
    for s in range(0, M, B):
        idx = perm[s:s + B]
        idx = idx[: (idx.numel() // q) * q]
        if idx.numel() == 0 or (max_steps is not None and steps >= max_steps):
            break
        steps += 1
        yield tu[idx], ti[idx]


def train_epoch(params: CFParams, data: CFData, model: CFModel, *, tiling: tuple[int, int] | None = None,
                seed: int = 0, max_steps: int | None = None, opt=None, histories=None) -> EpochResult:
    """One epoch (or ``max_steps`` steps) of baseline (``tiling=None``) or tiled training.

    ``tiling`` is (N1 rows per thread tile, N2 refresh interval in per-thread iterations).
    Returns wall time of the training loop only (data shuffle included, evaluation excluded).
    """
    torch.set_num_threads(model.threads)
    warm_allocator()
    gen = torch.Generator().manual_seed(seed)
    hist_all = None
    if model.uses_aggregation:
        hist_all = torch.from_numpy(histories if histories is not None else user_histories(data, model.history, seed))
    losses = []
    if tiling is None:
        opt = opt or make_baseline_optimizer(params, model)
    else:
        for t in (params.user, params.item, params.W):
            t.requires_grad_(False)
        sampler = TileSampler(model.items, model.threads, tiling[0], tiling[1], model.per_thread_batch, gen)
    t0 = time.perf_counter()
    steps = 0
    multiple = model.threads
    if tiling is not None and tiling[1] < model.per_thread_batch:
        if model.per_thread_batch % tiling[1]:
            raise ValueError(f"refresh interval {tiling[1]} must divide the per-thread batch "
                             f"{model.per_thread_batch} when it is smaller")
        multiple = model.threads * tiling[1]
    batches = _batches(data, model, gen, max_steps, multiple)
    shuffle_s = next(batches)
    step_times = []
    ts = time.perf_counter()
    for users, pos in batches:
        hist = hist_all[users] if hist_all is not None else None
        if tiling is None:
            negs = torch.randint(0, model.items, (users.numel(), model.negatives), generator=gen)
            losses.append(baseline_step(params, opt, users, pos, negs, hist, model))
        else:
            sampler.b = users.numel() // model.threads
            tiles, neg_local = sampler.next(model.negatives)
            losses.append(tiled_step(params, users, pos, hist, tiles, neg_local, model))
        steps += 1
        te = time.perf_counter()
        step_times.append(te - ts)
        ts = te
    dt = time.perf_counter() - t0
    return EpochResult(dt, steps, float(np.mean(losses)) if losses else float("nan"), shuffle_s, tuple(step_times))


@torch.no_grad()
def evaluate(params: CFParams, data: CFData, model: CFModel, k: int = 20, histories=None,
             max_users: int | None = None) -> dict:
    """Recall@k and NDCG@k on the held-out split (LightGCN convention: recall = hits/|test_u|),
    scoring every item by cosine and masking the user's training items."""
    users = np.array(sorted(data.test))
    if max_users is not None and users.size > max_users:
        users = users[np.linspace(0, users.size - 1, max_users).astype(int)]
    train = data.train_lists()
    hist_all = None
    if model.uses_aggregation:
        hist_all = torch.from_numpy(histories if histories is not None else user_histories(data, model.history, 0))
    items_n = F.normalize(params.item.detach(), dim=-1)
    disc = 1.0 / np.log2(np.arange(2, k + 2))
    rec, ndcg = [], []
    for s in range(0, users.size, 1024):
        uu = torch.from_numpy(users[s:s + 1024])
        hist = hist_all[uu] if hist_all is not None else None
        p = F.normalize(user_vectors(CFParams(params.user.detach(), params.item.detach(), params.W.detach()),
                                     uu, hist, model.gate), dim=-1)
        scores = p @ items_n.T
        for r, u in enumerate(uu.tolist()):
            tr = train.get(u)
            if tr is not None and len(tr):
                scores[r, torch.from_numpy(tr)] = -float("inf")
        top = torch.topk(scores, min(k, scores.shape[1]), dim=1).indices.numpy()
        for r, u in enumerate(uu.tolist()):
            truth = data.test[u]
            hit = np.isin(top[r], truth)
            rec.append(hit.sum() / truth.size)
            idcg = disc[: min(truth.size, k)].sum()
            ndcg.append((hit * disc[: hit.size]).sum() / idcg)
    return {f"recall_at_{k}": float(np.mean(rec)), f"ndcg_at_{k}": float(np.mean(ndcg)), "users": int(users.size)}
