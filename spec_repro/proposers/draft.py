"""Draft-model proposer: any causal LM that shares the target's tokenizer drafts a greedy chain of k tokens.

It keeps its own KV cache (:class:`spec_repro.engines.torch.KVState`). At each ``propose`` it compares the
tokens its cache holds with each row's context, drops what the target rejected (longest common prefix), feeds
the tokens it has not seen (the accepted tail and the target's bonus token) and then drafts k tokens one at a
time. Drafted tokens that the target accepts stay cached, as in gpt-fast.
"""
from __future__ import annotations

from typing import Sequence

from . import Proposer

__all__ = ["DraftModelProposer"]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftModelProposer(Proposer):
    name = "draft"
    method = "draft_model"

    def __init__(self, model):
        from ..engines.torch import KVState

        self.model = model.eval()
        self.state = KVState(self.model)

    def start(self, contexts):
        self.state.reset(len(contexts))
        # prefill all but the last token: propose() feeds it and reads the first draft from it
        self.state.extend([list(c[:-1]) for c in contexts], logits="last")

    def select(self, rows):
        self.state.select(rows)

    def propose(self, contexts, k):
        st = self.state
        if st.rows != len(contexts):
            self.start(contexts)
        keep, feed = [], []
        for r, c in enumerate(contexts):
            n = _common_prefix(st.tokens[r], c)
            n = min(n, len(c) - 1)  # always feed at least the last context token
            keep.append(n)
            feed.append(list(c[n:]))
        st.truncate(keep)
        drafts = [[] for _ in contexts]
        if k <= 0:
            return drafts
        logits = st.extend(feed, logits="last")
        for i in range(k):
            nxt = logits.argmax(dim=-1).tolist()
            for r, t in enumerate(nxt):
                drafts[r].append(int(t))
            if i + 1 < k:
                logits = st.extend([[t] for t in nxt], logits="last")
        return drafts
