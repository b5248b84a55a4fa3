"""Kernel tests: the CCL loss on a hand-computable case, hand-written backward == autograd."""
import math

import pytest
import torch

from paraplan.cf.kernels import (CFParams, TileSampler, ccl_loss, init_params, reference_loss,
                                            tiled_forward_backward, tiled_step, train_epoch, evaluate)
from paraplan.cf.model import CFModel
from paraplan.cf.data import synthetic

pytestmark = pytest.mark.torch

torch.set_num_threads(1)


def test_ccl_loss_hand_computed():
    # pos cos 0.5 -> 0.5; negs (0.9, 0.1, 0.6) with m=0.4, w=3, n=3 -> (0.5 + 0 + 0.2)·3/3 = 0.7
    pos = torch.tensor([0.5, 1.0])
    neg = torch.tensor([[0.9, 0.1, 0.6], [0.0, 0.0, 0.0]])
    loss = ccl_loss(pos, neg, margin=0.4, weight=3.0)
    assert loss.item() == pytest.approx((0.5 + 0.7 + 0.0) / 2, abs=1e-6)


def test_reference_loss_on_unit_vectors():
    # user (1,0); pos (1,1)/√2 -> cos √½; negs (0,1) cos 0 and (1,0) cos 1; m=0.5, w=2, n=2
    m = CFModel(users=1, items=3, interactions=1, dim=2, negatives=2, margin=0.5, negative_weight=2.0, batch=1)
    p = CFParams(torch.tensor([[2.0, 0.0]]), torch.tensor([[1.0, 1.0], [0.0, 3.0], [5.0, 0.0]]), torch.eye(2))
    loss = reference_loss(p, torch.tensor([0]), torch.tensor([0]), torch.tensor([[1, 2]]), None, m)
    expect = (1 - math.sqrt(0.5)) + (0.0 + 0.5) * 2 / 2
    assert loss.item() == pytest.approx(expect, abs=1e-6)


@pytest.mark.parametrize("history,gate", [(0, 1.0), (3, 0.6)])
def test_hand_backward_matches_autograd(history, gate):
    torch.manual_seed(0)
    m = CFModel(users=30, items=50, interactions=100, dim=8, negatives=7, margin=0.1, negative_weight=5.0,
                history=history, gate=gate, batch=12, threads=3)
    p = init_params(m, seed=1)
    p.item.mul_(10)  # spread cosines so that relus are active on both sides
    users = torch.randint(0, 30, (12,))
    pos = torch.randint(0, 50, (12,))
    hist = torch.randint(0, 50, (12, history)) if history else None
    tiles = torch.randint(0, 50, (3, 6))
    local = torch.randint(0, 6, (12, 7))
    gr = tiled_forward_backward(p, users, pos, hist, tiles, local, m)
    du, di, dW = gr.dense(p)
    # the same negatives as explicit ids: row r of chunk t uses tiles[t][local[r]]
    negs = torch.stack([tiles[r // 4][local[r]] for r in range(12)])
    q = p.clone()
    for t in (q.user, q.item, q.W):
        t.requires_grad_(True)
    loss = reference_loss(q, users, pos, negs, hist, m)
    loss.backward()
    assert gr.loss == pytest.approx(loss.item(), rel=1e-5)
    assert (gr.dense(p)[1] != 0).any()
    torch.testing.assert_close(du, q.user.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(di, q.item.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(dW, q.W.grad if history else torch.zeros_like(dW), rtol=1e-4, atol=1e-6)


def test_tiled_sgd_step_equals_dense_sgd_step():
    m = CFModel(users=20, items=40, interactions=50, dim=4, negatives=5, batch=8, threads=2, learning_rate=0.5)
    p = init_params(m, seed=3)
    users, pos = torch.randint(0, 20, (8,)), torch.randint(0, 40, (8,))
    tiles, local = torch.randint(0, 40, (2, 10)), torch.randint(0, 10, (8, 5))
    q = p.clone()
    for t in (q.user, q.item, q.W):
        t.requires_grad_(True)
    negs = torch.stack([tiles[r // 4][local[r]] for r in range(8)])
    reference_loss(q, users, pos, negs, None, m).backward()
    tiled_step(p, users, pos, None, tiles, local, m)
    torch.testing.assert_close(p.item, (q.item - 0.5 * q.item.grad).detach(), rtol=1e-5, atol=1e-6)


def test_tile_sampler_refreshes_every_n2_iterations():
    s = TileSampler(items=100, threads=2, tile_rows=8, refresh_iterations=12, per_thread_batch=4,
                    generator=torch.Generator().manual_seed(0))
    seen = []
    for _ in range(9):  # 36 iterations per thread -> windows 0,1,2 -> 3 refreshes
        tiles, local = s.next(5)
        seen.append(tiles.clone())
        assert local.shape == (8, 5) and int(local.max()) < 8
    assert s.refreshes == 3
    assert torch.equal(seen[0], seen[2]) and not torch.equal(seen[2], seen[3])


def test_tiny_training_learns_above_random():
    d = synthetic(200, 400, 4000, seed=1)
    m = CFModel(users=d.users, items=d.items, interactions=d.train_interactions, dim=16, negatives=32,
                batch=128, threads=1, learning_rate=5.0, margin=0.4, negative_weight=30.0)
    p = init_params(m)
    before = evaluate(p, d, m)["recall_at_20"]
    for e in range(4):
        train_epoch(p, d, m, tiling=(64, 256), seed=e)
    after = evaluate(p, d, m)["recall_at_20"]
    assert after > before + 0.02


def test_tile_sampler_short_refresh_draws_a_tile_per_window():
    # N2 = 4 < b = 6 is not allowed (must divide); N2 = 3 < b = 6: two windows per thread per step
    g = torch.Generator().manual_seed(0)
    s = TileSampler(items=100, threads=2, tile_rows=5, refresh_iterations=3, per_thread_batch=6, generator=g)
    tiles, local = s.next(4)
    assert tiles.shape == (4, 5) and local.shape == (12, 4) and s.refreshes == 2
    tiles2, _ = s.next(4)
    assert not torch.equal(tiles, tiles2)
    bad = TileSampler(items=100, threads=1, tile_rows=5, refresh_iterations=4, per_thread_batch=6, generator=g)
    with pytest.raises(ValueError):
        bad.next(4)


def test_short_refresh_epoch_runs_whole_windows():
    d = synthetic(100, 300, 2500, seed=2)
    m = CFModel(users=d.users, items=d.items, interactions=d.train_interactions, dim=8, negatives=4,
                batch=64, threads=2, learning_rate=1.0)
    res = train_epoch(init_params(m), d, m, tiling=(16, 8), seed=0)
    assert res.steps == -(-d.train_interactions // 64) or res.steps == d.train_interactions // 64
    assert math.isfinite(res.mean_loss)
