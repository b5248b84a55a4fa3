"""Implicit-feedback data for CF training: a seeded power-law generator and the LightGCN text format.

LightGCN format (``kuandeng/LightGCN: Data/*/train.txt``): one line per user,
``user item item ...``, all non-negative integers separated by spaces.

The generator is a bipartite expected-degree (Chung-Lu) model: user weights ∝ rank^−s_u, item
weights ∝ rank^−s_i, with slopes from the measured rank-frequency slopes of Gowalla, Yelp2018 and
Amazon-Book (s_i ≈ 0.61-0.68, s_u ≈ 0.54-0.60: log-log fits over the top half of the ranks of the
LightGCN splits, kuandeng/LightGCN Data/*/test.txt; paraplan/data/fitted_constants.yaml). Departure:
so that a model has something to learn beyond popularity, users and items also get one of
``clusters`` latent groups and a fraction ``affinity`` of each user's items is drawn from the
user's own group (with the same power-law weights inside the group).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paraplan.constants import fitted
from paraplan.errors import ConfigError
from paraplan.io import read_text

ITEM_SLOPE = fitted("cf_item_popularity_slope")   # mean of Gowalla, Yelp2018 and Amazon-Book
USER_SLOPE = fitted("cf_user_activity_slope")


@dataclass(frozen=True)
class CFData:
    """A train/test split. ``train_users``/``train_items`` are parallel arrays of interactions;
    ``test`` maps a user to the array of its held-out items."""
    users: int
    items: int
    train_users: np.ndarray
    train_items: np.ndarray
    test: dict
    name: str = "data"

    @property
    def train_interactions(self) -> int:
        return int(self.train_users.size)

    def train_lists(self) -> dict:
        """User -> sorted array of training items."""
        order = np.argsort(self.train_users, kind="stable")
        u, it = self.train_users[order], self.train_items[order]
        cuts = np.flatnonzero(np.diff(u)) + 1
        return {int(us[0]): np.sort(its) for us, its in zip(np.split(u, cuts), np.split(it, cuts)) if us.size}


def _power_weights(n: int, slope: float, rng: np.random.Generator) -> np.ndarray:
    w = np.arange(1, n + 1, dtype=np.float64) ** (-slope)
    rng.shuffle(w)  # popularity is unrelated to the id
    return w / w.sum()


def synthetic(users: int, items: int, interactions: int, *, seed: int = 0, item_slope: float = ITEM_SLOPE,
              user_slope: float = USER_SLOPE, clusters: int = 16, affinity: float = 0.8,
              min_per_user: int = 4, test_fraction: float = 0.2) -> CFData:
    """Seeded power-law implicit-feedback data, split per user into train and test.

    Draws about ``interactions`` distinct (user, item) pairs; every user gets at least
    ``min_per_user`` items so that each can be split. Deterministic for a given seed.
    """
    for name, v in (("users", users), ("items", items), ("interactions", interactions)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(name, f"must be a positive integer, got {v!r}")
    if items < 2 * min_per_user:
        raise ConfigError("items", f"{items} is too few; need at least {2 * min_per_user}")
    if interactions < users * min_per_user:
        raise ConfigError("interactions", f"{interactions} is fewer than users·{min_per_user} = "
                          f"{users * min_per_user}; every user needs {min_per_user} to split")
    if interactions > 0.5 * users * items:
        raise ConfigError("interactions", f"{interactions} exceeds half of users·items; the matrix would be dense")
    if not 0 <= affinity <= 1:
        raise ConfigError("affinity", f"must lie in [0, 1], got {affinity}")
    rng = np.random.default_rng(seed)
    wu = _power_weights(users, user_slope, rng)
    wi = _power_weights(items, item_slope, rng)
    k = max(1, min(clusters, items // (2 * min_per_user)))
    ucl = rng.integers(0, k, users)
    icl = rng.integers(0, k, items)
    members = [np.flatnonzero(icl == c) for c in range(k)]
    members = [m if m.size else np.arange(items) for m in members]
    member_w = [wi[m] / wi[m].sum() for m in members]

    def draw_items(user_ids: np.ndarray) -> np.ndarray:
        out = rng.choice(items, size=user_ids.size, p=wi)
        local = rng.random(user_ids.size) < affinity
        for c in range(k):
            sel = np.flatnonzero(local & (ucl[user_ids] == c))
            if sel.size:
                out[sel] = members[c][rng.choice(members[c].size, size=sel.size, p=member_w[c])]
        return out

    base_u = np.repeat(np.arange(users), min_per_user)
    extra = int(interactions * 1.15) - base_u.size
    u = np.concatenate([base_u, rng.choice(users, size=max(extra, 0), p=wu)])
    pairs = np.unique(u.astype(np.int64) * items + draw_items(u))
    for _ in range(10):  # duplicates of popular pairs leave us short: draw more
        if pairs.size >= interactions:
            break
        nu = rng.choice(users, size=int((interactions - pairs.size) * 1.5) + 1, p=wu)
        pairs = np.unique(np.concatenate([pairs, nu * items + draw_items(nu)]))
    for _ in range(20):  # top up users left short by duplicate pairs
        cnt = np.bincount(pairs // items, minlength=users)
        short = np.flatnonzero(cnt < min_per_user)
        if not short.size:
            break
        nu = np.repeat(short, min_per_user)
        pairs = np.unique(np.concatenate([pairs, nu * items + draw_items(nu)]))
    if pairs.size > interactions:  # trim, keeping every user's first min_per_user pairs
        keep = np.ones(pairs.size, bool)
        uu = pairs // items
        first = np.searchsorted(uu, uu, side="left")
        rank = np.arange(pairs.size) - first
        optional = np.flatnonzero(rank >= min_per_user)
        drop = rng.choice(optional, size=min(pairs.size - interactions, optional.size), replace=False)
        keep[drop] = False
        pairs = pairs[keep]
    lists = {}
    uu, ii = pairs // items, pairs % items
    cuts = np.flatnonzero(np.diff(uu)) + 1
    for us, its in zip(np.split(uu, cuts), np.split(ii, cuts)):
        lists[int(us[0])] = its
    return split(lists, users=users, items=items, test_fraction=test_fraction, seed=seed,
                 name=f"synthetic-{users}x{items}-{seed}")


def split(lists: dict, *, users: int | None = None, items: int | None = None, test_fraction: float = 0.2,
          seed: int = 0, name: str = "data") -> CFData:
    """Per-user random split: round(test_fraction·n) of each user's n items (at least 1 when n ≥ 2)
    go to test."""
    if not 0 < test_fraction < 1:
        raise ConfigError("test_fraction", f"must lie in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed + 1)
    tu, ti, test = [], [], {}
    for u in sorted(lists):
        its = rng.permutation(np.asarray(lists[u], dtype=np.int64))
        nt = 0 if its.size < 2 else max(1, int(round(test_fraction * its.size)))
        if nt:
            test[u] = np.sort(its[:nt])
        tu.append(np.full(its.size - nt, u, dtype=np.int64))
        ti.append(its[nt:])
    return _make(lists, tu, ti, test, users, items, name)


def _make(lists, tu, ti, test, users, items, name) -> CFData:
    max_u = max(lists) if lists else -1
    max_i = max((int(np.max(v)) for v in lists.values() if len(v)), default=-1)
    users = max(users or 0, max_u + 1)
    items = max(items or 0, max_i + 1)
    if users < 1 or items < 1:
        raise ConfigError("dataset", "has no interactions")
    return CFData(users, items, np.concatenate(tu) if tu else np.zeros(0, np.int64),
                  np.concatenate(ti) if ti else np.zeros(0, np.int64), test, name)


MAX_ID = 2**31 - 1


def read_lightgcn(path: str | Path) -> dict:
    """Read ``user item item ...`` lines into {user: int64 array}; blank lines are skipped.

    Raises ConfigError naming the file and line for a non-integer or negative token or a user
    repeated on two lines. A line holding only a user id (no items) is accepted: LightGCN writes those.
    """
    path = Path(path)
    text = read_text(path, "dataset")
    lists = {}
    for n, line in enumerate(text.splitlines(), 1):
        tok = line.split()
        if not tok:
            continue
        try:
            vals = [int(t) for t in tok]
        except ValueError:
            bad = next(t for t in tok if not t.lstrip("-").isdigit())
            raise ConfigError("dataset", f"line {n}: {bad!r} is not an integer id",
                              accepted="lines of 'user item item ...' non-negative integers",
                              source=str(path)) from None
        if min(vals) < 0:
            raise ConfigError("dataset", f"line {n}: negative id {min(vals)}", source=str(path))
        if max(vals) > MAX_ID:
            raise ConfigError("dataset", f"line {n}: id {str(max(vals))[:30]} is too large", accepted=f"ids up to {MAX_ID}",
                              source=str(path))
        if vals[0] in lists:
            raise ConfigError("dataset", f"line {n}: user {vals[0]} appears on an earlier line too",
                              source=str(path))
        lists[vals[0]] = np.asarray(vals[1:], dtype=np.int64)
    if not lists:
        raise ConfigError("dataset", "no interaction lines", source=str(path))
    return lists


def write_lightgcn(path: str | Path, lists: dict) -> None:
    """Write {user: items} in the LightGCN text format, users in ascending order."""
    lines = [" ".join(str(int(x)) for x in [u, *lists[u]]) for u in sorted(lists)]
    Path(path).write_text("\n".join(lines) + "\n")


def load_lightgcn(train_path: str | Path, test_path: str | Path | None = None, *,
                  test_fraction: float = 0.2, seed: int = 0) -> CFData:
    """A LightGCN dataset: train.txt (+ test.txt), or one file split per user."""
    train = read_lightgcn(train_path)
    if test_path is None:
        return split(train, test_fraction=test_fraction, seed=seed, name=Path(train_path).stem)
    test = read_lightgcn(test_path)
    tu = [np.full(len(v), u, dtype=np.int64) for u, v in sorted(train.items())]
    ti = [np.asarray(v, dtype=np.int64) for _, v in sorted(train.items())]
    both = {u: np.concatenate([train.get(u, np.zeros(0, np.int64)), test.get(u, np.zeros(0, np.int64))])
            for u in set(train) | set(test)}
    return _make(both, tu, ti, {u: np.sort(v) for u, v in test.items() if len(v)}, None, None,
                 Path(train_path).parent.name or "dataset")


def user_histories(data: CFData, length: int, seed: int = 0) -> np.ndarray:
    """A fixed-length history per user (users × length), drawn with replacement from its training
    items; a user without training items gets item 0 (masked out by the gate in practice)."""
    rng = np.random.default_rng(seed + 2)
    out = np.zeros((data.users, max(length, 0)), dtype=np.int64)
    if length <= 0:
        return out
    for u, its in data.train_lists().items():
        out[u] = rng.choice(its, size=length, replace=True)
    return out
