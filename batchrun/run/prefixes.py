"""The prefix tree of a run of planned requests: which prompts share which prefix, and its size.

Requests sharing a prompt prefix of at least `planner.MIN_SHARED` characters form a node; inside
it, those sharing at least `MIN_SHARED` more form a child node, and so on (a system prompt shared
by everything, then a document, then the questions about it). A request's *leaf* is the deepest
node it belongs to; its *group* is every request with the same leaf. A node's size is the tokens
it adds to its parent's prefix (characters over `CHARS_PER_TOKEN`: the parent never loads a
tokenizer), which is what the engine's KV cache must hold for the group to find it cached.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from batchrun.openai.records import Request
from batchrun.run.planner import MIN_SHARED, common_prefix, expected_tokens, prompt_text

# About four characters a token in English text (the planner's estimate too); an overestimate
# for most tokenizers, so a budget built on it errs towards fewer prefixes at once.
CHARS_PER_TOKEN = 4
# Nested prefixes deeper than this are one node: a bound on the tree's cost (each level is one
# pass over its requests) for text that nests without end.
MAX_DEPTH = 8


@dataclass(eq=False)
class Node:
    """A shared prefix: the characters it spans from the prompt's start, the tokens it adds to
    its parent's, and the parent (None at the top)."""

    chars: int
    tokens: int
    parent: Node | None = None

    def chain(self) -> list[Node]:
        """This node and its ancestors, innermost first."""
        out: list[Node] = []
        node: Node | None = self
        while node is not None:
            out.append(node)
            node = node.parent
        return out


@dataclass(frozen=True, slots=True)
class Tail:
    """The tokens a request needs of its own: its prompt past its shared prefix (estimated from
    characters), the answer it asks for, and its whole prompt (estimated, for calibration)."""

    prompt: int
    answer: int
    whole: int


@dataclass(eq=False)
class Group:
    """The requests whose deepest shared prefix is `leaf`, in the plan's order, each with the
    tokens it needs of its own."""

    leaf: Node
    requests: deque[Request] = field(default_factory=deque)
    tails: dict[str, Tail] = field(default_factory=dict)


@dataclass
class Tree:
    """A run of requests as prefix groups (in the order their first request comes in the plan)
    and requests that share no prefix (in the plan's order), with each one's own tokens."""

    groups: list[Group]
    alone: deque[Request]
    alone_tails: dict[str, Tail]


def _tokens(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)


def prefix_tree(requests: Sequence[Request]) -> Tree:
    """The prefix groups of `requests` (given in the plan's order)."""
    n = len(requests)
    # Keyed by what answers them too: a LoRA adapter's KV differs from the base model's for
    # the same text (the model's name is far shorter than MIN_SHARED: it makes no node).
    texts = [f"{r.body.get('model')}\x1d{prompt_text(r)}" for r in requests]
    by_text = sorted(range(n), key=texts.__getitem__)
    lcp = [0] * n  # with the one before, in text order
    for k in range(1, n):
        lcp[k] = common_prefix(texts[by_text[k - 1]], texts[by_text[k]])
    leaf: list[Node | None] = [None] * n  # by position in text order
    # (lo, hi, node, depth): positions lo..hi-1 in text order all share `node`'s prefix.
    stack: list[tuple[int, int, Node | None, int]] = [(0, n, None, 0)]
    while stack:
        lo, hi, parent, depth = stack.pop()
        base = parent.chars if parent is not None else 0
        start = lo
        shared = -1  # the least lcp inside the current run
        for k in range(lo + 1, hi + 1):
            if k < hi and lcp[k] >= base + MIN_SHARED:
                shared = lcp[k] if shared < 0 else min(shared, lcp[k])
                continue
            if k - start == 1:
                leaf[start] = parent
            else:
                node = Node(shared, _tokens(shared - base), parent)
                if depth + 1 < MAX_DEPTH:
                    stack.append((start, k, node, depth + 1))
                else:
                    for j in range(start, k):
                        leaf[j] = node
            start, shared = k, -1
    groups: dict[int, Group] = {}
    alone: deque[Request] = deque()
    alone_tails: dict[str, Tail] = {}
    position = [0] * n  # plan position -> text position
    for k, p in enumerate(by_text):
        position[p] = k
    for p, request in enumerate(requests):
        deepest = leaf[position[p]]
        answer = expected_tokens(request)
        whole = _tokens(len(texts[p]))
        if deepest is None:
            alone.append(request)
            alone_tails[request.custom_id] = Tail(whole, answer, whole)
            continue
        group = groups.get(id(deepest))
        if group is None:
            group = groups[id(deepest)] = Group(deepest)
        group.requests.append(request)
        group.tails[request.custom_id] = Tail(_tokens(len(texts[p]) - deepest.chars), answer, whole)
    return Tree(list(groups.values()), alone, alone_tails)
