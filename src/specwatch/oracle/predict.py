"""Closed-form greedy predictions of the oracle models: the chain, verifies per token, trees, NGRAM's corpus.

``Oracle`` knows the target's successor permutation and the draft's profile, so acceptance length,
verify counts and outputs of a greedy case have exact expected values (see
``specwatch.oracle.checkpoints`` for how the weights realise them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional

import numpy as np

from specwatch.core.case import Algorithm, Profile
from specwatch.oracle.shapes import FIRST_ACTIVE, RIGHT_WEIGHT, WRONG_WEIGHT, Shape


@lru_cache(maxsize=64)
def cycle_of(active: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(``Oracle.order`` of ``active`` tokens under ``seed``, each active index's place in it),
    drawn once per (active, seed); read-only."""
    order = np.random.default_rng(seed).permutation(active)
    position = np.empty_like(order)
    position[order] = np.arange(active)
    order.flags.writeable = position.flags.writeable = False
    return order, position


@dataclass(frozen=True)
class Oracle:
    """The closed-form successor function and the draft's wrong-token set."""

    shape: Shape
    seed: int
    profile: Profile

    @property
    def order(self) -> np.ndarray:
        """Active-token indices in cycle order: sigma(order[i]) = order[i+1]."""
        return np.random.default_rng(self.seed).permutation(self.shape.active)

    def successor_index(self) -> np.ndarray:
        """succ[j] = index of sigma(t_j)."""
        order = self.order
        succ = np.empty_like(order)
        succ[order] = np.roll(order, -1)
        return succ

    def wrong_set(self) -> np.ndarray:
        """Boolean mask over active indices where the draft's first choice is wrong."""
        a = self.shape.active
        if self.profile is Profile.second_choice:
            return np.ones(a, dtype=bool)
        q = {Profile.q01: 0.1, Profile.q03: 0.3}.get(self.profile, 0.0)
        mask = np.zeros(a, dtype=bool)
        mask[np.random.default_rng(self.seed + 1).permutation(a)[: round(q * a)]] = True
        return mask

    def chain(self, start_index: int, length: int) -> list[int]:
        """Token ids t, sigma(t), ... of ``length`` tokens from active index ``start_index``."""
        order, position = cycle_of(self.shape.active, self.seed)
        if 0 <= start_index < len(order):  # sigma is one cycle through ``order``: the chain is a slice of it
            steps = (position[start_index] + np.arange(length)) % len(order)
            return (FIRST_ACTIVE + order[steps]).tolist()
        succ = self.successor_index()
        out, j = [], start_index
        for _ in range(length):
            out.append(FIRST_ACTIVE + int(j))
            j = succ[j]
        return out

    def expected_verifies(
        self, first_output_token: int, output_len: int, num_steps: int, topk: int, num_draft_tokens: int
    ) -> int:
        """Verify steps for ``output_len`` greedy tokens: closed form for a chain, tree simulation else."""
        if topk == 1:
            return self.expected_chain_verifies(first_output_token, output_len, num_steps)
        if self.profile is Profile.random:
            raise ValueError("random profile has no closed form")
        return expected_tree_verifies(self, first_output_token, output_len, num_steps, topk, num_draft_tokens)

    def expected_block_verifies(self, first_output_token: int, output_len: int, block_size: int) -> int:
        """Verify steps of the DFLASH oracle draft (``specwatch.oracle.dflash``) for ``output_len``
        tokens: each block proposes ``block_size - 1`` tokens, right while the chain stays outside
        the wrong set, so a verify accepts the chain run at depth ``block_size - 1``."""
        return self.expected_chain_verifies(first_output_token, output_len, block_size - 1)

    def expected_case_verifies(
        self,
        algorithm: Algorithm,
        first_output_token: int,
        output_len: int,
        num_steps: int,
        topk: int,
        num_draft_tokens: int,
    ) -> int:
        """Verify steps of a case's algorithm: DFLASH's block (``num_draft_tokens``, SGLang's block
        size), the EAGLE family's chain or tree (``expected_verifies``) otherwise."""
        if algorithm is Algorithm.DFLASH:
            return self.expected_block_verifies(first_output_token, output_len, num_draft_tokens)
        return self.expected_verifies(first_output_token, output_len, num_steps, topk, num_draft_tokens)

    def expected_chain_verifies(self, first_output_token: int, output_len: int, num_steps: int) -> int:
        """Verify steps a chain (topk = 1) needs for ``output_len`` tokens, the first from prefill."""
        if self.profile is Profile.random:
            raise ValueError("random profile has no closed form")
        wrong = self.wrong_set()
        succ = self.successor_index()

        def accepted(j: int) -> int:
            n, k = 0, j
            while n < num_steps and not wrong[k]:
                n, k = n + 1, succ[k]
            return n

        return count_verifies(succ, first_output_token, output_len, accepted)


def _draft_topk(oracle: "Oracle", wrong: np.ndarray, succ: np.ndarray, j: int, topk: int) -> list[tuple[int, float]]:
    """The draft's top-k (active index or -1 for an inactive token, probability) after token index j.

    Logits (module docstring): sqrt(H) at the first choice, 0.75*sqrt(H) at the second (wrong-set
    tokens only), 0 elsewhere over the vocab; an inactive token (-1) has all-zero logits."""
    s = oracle.shape
    v = s.vocab
    if j < 0:
        return [(-1, 1.0 / v)] * topk
    big = math.sqrt(s.hidden)
    if wrong[j]:
        tops = [(int(succ[succ[j]]), WRONG_WEIGHT * big), (int(succ[j]), RIGHT_WEIGHT * big)]
    else:
        tops = [(int(succ[j]), big)]
    m = max(l for _, l in tops)
    z = sum(math.exp(l - m) for _, l in tops) + (v - len(tops)) * math.exp(-m)
    out = [(t, math.exp(l - m) / z) for t, l in tops]
    out += [(-1, math.exp(-m) / z)] * max(0, topk - len(out))
    return out[:topk]


def expected_tree_verifies(
    oracle: "Oracle", first_output_token: int, output_len: int, num_steps: int, topk: int, num_draft_tokens: int
) -> int:
    """Verify steps for ``output_len`` tokens under SGLang's EAGLE tree drafting, on the oracle's
    known draft probabilities.

    Mirrors ``select_top_k_tokens`` and ``organize_draft_results`` (sglang/srt/speculative): step 0
    takes the top-k children of the last committed token; each later step scores every child of the
    k beams by (beam score x child probability) and keeps the k best as beams; all candidates
    (k + (num_steps - 1) * k^2) compete and the best num_draft_tokens - 1 form the tree. The target
    then accepts greedily: from the root, follow the child equal to sigma(current) while one is in
    the tree. Ties are broken by candidate order, as torch.topk does on equal values (an assumption:
    the oracle's ties are between paths that can never both be accepted)."""
    accepted = tree_acceptance(oracle, num_steps, topk, num_draft_tokens)
    return count_verifies(oracle.successor_index(), first_output_token, output_len, accepted)


def tree_acceptance(oracle: "Oracle", num_steps: int, topk: int, num_draft_tokens: int) -> Callable[[int], int]:
    """The drafts the target accepts from the tree drafted after token index j, as a function of j
    (``expected_tree_verifies``' rule; it depends on j alone, so callers over many prompts may cache it)."""
    wrong = oracle.wrong_set()
    succ = oracle.successor_index()

    def accepted(j: int) -> int:
        # candidates: (score, token, parent candidate id or None for root)
        cands: list[tuple[float, int, Optional[int]]] = []
        first = _draft_topk(oracle, wrong, succ, j, topk)
        beams = []
        for tok, p in first:
            cands.append((p, tok, None))
            beams.append((p, tok, len(cands) - 1))
        for _ in range(num_steps - 1):
            level = []
            for score, tok, cid in beams:
                for ctok, p in _draft_topk(oracle, wrong, succ, tok, topk):
                    cands.append((score * p, ctok, cid))
                    level.append((score * p, ctok, len(cands) - 1))
            order = sorted(range(len(level)), key=lambda i: -level[i][0])[:topk]
            beams = [level[i] for i in order]
        keep = sorted(range(len(cands)), key=lambda i: -cands[i][0])[: num_draft_tokens - 1]
        kept = set(keep)
        children: dict[Optional[int], list[int]] = {}
        for i in sorted(kept):
            parent = cands[i][2]
            if parent is None or parent in kept:
                children.setdefault(parent, []).append(i)
        node, cur, n = None, j, 0
        while True:
            want = int(succ[cur])
            nxt = next((i for i in children.get(node, []) if cands[i][1] == want), None)
            if nxt is None:
                return n
            node, cur, n = nxt, want, n + 1

    return accepted


def count_verifies(succ: np.ndarray, first_output_token: int, output_len: int, accepted) -> int:
    """Verify steps until ``output_len`` tokens exist (the first from prefill): each verify at last
    committed token index j commits ``accepted(j)`` drafts plus the target's bonus token."""
    j = first_output_token - FIRST_ACTIVE
    produced, verifies = 1, 0
    while produced < output_len:
        commit = accepted(j) + 1
        for _ in range(commit):
            j = succ[j]
        produced += commit
        verifies += 1
    return verifies


NGRAM_MAX_TRIE_DEPTH = 18
"""SGLang's ``speculative_ngram_max_trie_depth`` default (0.5.12-0.5.17): each corpus window's length."""


class NgramCorpusModel:
    """What SGLang's NGRAM corpus holds for sigma-chain requests, and the acceptance that follows.

    The corpus (``ngram_worker._update_ngram_corpus``, ``ngram_corpus/trie.cpp``) takes, after each
    verify, a window of the last ``depth`` tokens of every request in the decode batch, and drafts
    from the suffixes of a request's own last tokens. Every window is a piece of the chain, so every
    trie path is one: the draft is the chain itself, as far as some window reaches past the request's
    last token (at most ``depth - 1``), capped at ``num_draft_tokens - 1``, and all of it is
    accepted. Only where windows end matters, one cycle position per request and step (the
    request's last token when its draft was made), plus one more at its last token when it finishes,
    also for a request that finishes at prefill (max_new_tokens = 1), without a verify counted. That
    last window is what the records need; the model assumes, without a check in SGLang's code, that the
    overlap scheduler learns of a finish one iteration late and puts the window once more. A flush
    resets the corpus. Checked against every standard NGRAM record on the H200s (0.5.17, dcp 1 and
    2, triton and flashinfer, page 1/64, topk 1/4: 21 of 21 repeats exact, replaying the harness of
    the time: warm-up, then per repeat a prefill-only batch and the timed one, no flush between;
    ``tests/test_oracle.py``). It assumes the batch decodes together from its prefill on (no queue,
    no retraction), so near-full cases get no expectation."""

    def __init__(self, oracle: "Oracle", depth: int = NGRAM_MAX_TRIE_DEPTH):
        succ = oracle.successor_index()
        self.cycle = len(succ)
        self.position = np.empty(self.cycle, dtype=np.int64)  # active index -> place on sigma's cycle
        j = 0
        for k in range(self.cycle):
            self.position[j] = k
            j = succ[j]
        self.depth = depth
        self.window_ends: set[int] = set()

    def flush(self) -> None:
        """``flush_cache``: the scheduler resets the corpus (``NGRAMWorker.clear_cache_pool``)."""
        self.window_ends.clear()

    def prefill_only(self, starts: list[int], input_len: int) -> None:
        """A batch with max_new_tokens = 1: each request's window goes in once, at its first output."""
        self.window_ends.update(int(self.position[s] + input_len) % self.cycle for s in starts)

    def decode_batch(self, starts: list[int], input_len: int, output_len: int, num_draft_tokens: int) -> list[float]:
        """Acceptance length (output tokens per verify) of each request of a batch of chain prompts
        from active indices ``starts``, ``input_len`` long, decoding ``output_len`` tokens together."""
        a, last = self.cycle, [int(self.position[s] + input_len) % self.cycle for s in starts]
        produced, verifies = [1] * len(starts), [0] * len(starts)
        running = [i for i in range(len(starts)) if output_len > 1]
        while running:
            drafts = {}
            for i in running:
                reach = next((d for d in range(self.depth - 1, 0, -1) if (last[i] + d) % a in self.window_ends), 0)
                drafts[i] = min(num_draft_tokens - 1, reach)
            self.window_ends.update(last[i] for i in running)
            for i in running:
                last[i] = (last[i] + drafts[i] + 1) % a
                produced[i] += drafts[i] + 1
                verifies[i] += 1
            done = [i for i in running if produced[i] >= output_len]
            self.window_ends.update(last[i] for i in done)
            running = [i for i in running if produced[i] < output_len]
        return [output_len / v if v else float(output_len) for v in verifies]
