"""What the CPU must not change: one process's fingerprint of the keyed randomness and of every
rule's decisions, printed as JSON for ``tests/test_dispatch.py``, which runs it under the
dispatch paths this machine can emulate and compares them.

``python -m tests.dispatch_probe [--threads N]`` prints:

``hashes``
    the sha256 of the keyed hashes and uniforms on a grid of keys (numpy), which every machine
    must reproduce bit for bit; ``hash_backends_equal`` says whether torch's are the same bits;
``noise_pairs_differing``, ``noise_max_gap``
    over the (seed, position) pairs ``range(200) x range(30)``, how many Gumbel noise vectors of
    50 tokens differ in any bit between numpy and torch, and the largest gap in units of
    ``2**-52 max(1, |G|)`` (the promise: at most ``keyed.NOISE_ULPS``);
``gumbel_decisions_differing``
    over the same pairs, how many Gumbel-max tokens ``argmax log p + G`` differ between the
    numpy core and the torch twin (the promise: none);
``twin_core_mismatches``, ``decisions``
    per rule and draft law, how many keyed verdicts of the torch twin differ from the numpy
    core's on random trees (the promise: none), and the sha256 of all the verdicts, which
    must not depend on the dispatch path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import numpy as np
import torch

from coupling import keyed
from coupling.rules import RULES
from coupling.rules.gumbel.torch import target_tokens

from .torch_helpers import own_roots, random_trees, verdict_rows

SEEDS, POSITIONS, TOKENS = range(200), range(30), 50


def _sha(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def hashes() -> tuple[str, bool]:
    """The hashes and uniforms of every stream on a grid of keys (seeds up to 2**64 - 1)."""
    seeds = np.array([0, 1, 17, 2**32 + 5, 2**63 - 1, 2**64 - 1], dtype=np.uint64)
    s, t, j = seeds.reshape(-1, 1, 1), np.arange(30, dtype=np.uint64).reshape(1, -1, 1), \
        np.arange(64, dtype=np.uint64).reshape(1, 1, -1)
    xp, words = keyed.torch_backend(), []
    equal = True
    for stream in range(4):
        h = keyed.keyed_hash(s, t, stream, j)
        u = keyed.uniforms(s, t, stream, j)
        st, tt, jt = (torch.from_numpy(a.astype(np.int64)) for a in (s, t, j))
        equal &= np.array_equal(h, keyed.keyed_hash(st, tt, stream, jt, xp).numpy().view(
            np.uint64)) and np.array_equal(u, keyed.uniforms(st, tt, stream, jt, xp).numpy())
        words += [h, u]
    return _sha(*words), bool(equal)


def noise_and_gumbel_decisions() -> dict:
    """Numpy against torch on the Gumbel noise and the Gumbel-max token of every pair."""
    from coupling.torch_backend import gumbel_noise

    rng = np.random.default_rng(53)
    laws = rng.dirichlet(np.full(TOKENS, 0.3), size=len(POSITIONS))       # one law a position
    pos = np.array(POSITIONS)
    differing, gap, decisions_differing, tokens = 0, 0.0, 0, []
    for seed in SEEDS:
        g_np = keyed.gumbel_noise(seed, pos, np.arange(TOKENS))           # [30, 50]
        g_t = gumbel_noise(torch.tensor([[seed]]), torch.from_numpy(pos)[None], TOKENS,
                           dtype=torch.float64)[0].numpy()
        differing += int((g_np != g_t).any(1).sum())
        gap = max(gap, keyed.noise_gap(g_np, g_t))
        y_np = np.argmax(np.log(laws) + g_np, 1)
        y_t = target_tokens(torch.from_numpy(laws), torch.tensor(seed),
                            torch.from_numpy(pos)).numpy()
        decisions_differing += int((y_np != y_t).sum())
        tokens.append(y_t)
    return {"noise_pairs_differing": differing, "noise_max_gap": gap,
            "gumbel_decisions_differing": decisions_differing,
            "gumbel_decisions": _sha(np.stack(tokens))}


def numpy_rows(rule, X, P, Q, seeds, positions, replacement) -> list[tuple[int, int, int]]:
    """The numpy core's verdicts on the keyed numbers the twin draws: the rule's
    ``call_uniforms``, or the keyed noise of a shared-noise rule (``rule.shared_noise``)."""
    g, V = X.shape[-1], P.shape[-1]
    out = []
    for b in range(X.shape[0]):
        s, t = int(seeds[b]), int(positions[b])
        arrays = (X[b].numpy(), P[b].numpy(), Q[b].numpy())
        if rule.shared_noise:
            noise = keyed.gumbel_noise(s, t + np.arange(g + 1), np.arange(V))
            out.append(tuple(rule.verify_block(*arrays, noise)))
        else:
            coins, u = rule.call_uniforms(s, t, g, X.shape[1])
            out.append(tuple(rule.verify_block(*arrays, coins, u, replacement=replacement)))
    return out


def rule_decisions(n_trees: int = 12) -> tuple[dict, str]:
    """Every rule's twin against its numpy core on the same keyed trees, one tree at a time,
    for each draft law the rule takes (first tokens from the rule's own draft law)."""
    mismatches, verdicts = {}, []
    for r, (name, rule) in enumerate(RULES.items()):
        modes = (True,) if rule.max_drafts == 1 else rule.draft_laws
        for replacement in modes:
            rng = np.random.default_rng(100 * r + replacement)
            bad, trees = 0, random_trees(rng, n_trees, replacement, sizes=(3, 8, 12))
            for i, (X, P, Q) in enumerate(trees):
                k = min(X.shape[1], rule.max_drafts or X.shape[1])
                X, P, Q = X[:, :k], P[:, :k], Q[:, :k]
                if not rule.supports(k, replacement):
                    continue
                X = own_roots(name, X, Q, replacement, rng)
                seeds, positions = torch.tensor([i]), torch.tensor([5 * i])
                got = verdict_rows(rule.torch.verify(X, P, Q, seeds=seeds, positions=positions,
                                                     replacement=replacement))
                bad += got != numpy_rows(rule, X, P, Q, seeds, positions, replacement)
                verdicts.append(np.array(got, dtype=np.int64))
            mismatches[f"{name}/{'iid' if replacement else 'distinct'}"] = int(bad)
    return mismatches, _sha(*verdicts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    digest, equal = hashes()
    mismatches, decisions = rule_decisions()
    out = {"config": {"torch_capability": torch.backends.cpu.get_cpu_capability(),
                      "numpy_disabled": os.environ.get("NPY_DISABLE_CPU_FEATURES", ""),
                      "threads": torch.get_num_threads()},
           "hashes": digest, "hash_backends_equal": equal, **noise_and_gumbel_decisions(),
           "twin_core_mismatches": mismatches, "decisions": decisions}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
