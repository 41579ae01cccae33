"""Relational graphs for RGR (seed 002): the graph type, random families, edge colouring.

A relational graph G = (V, E) on m items is a directed graph: edge (i, j) means
"source i attends to target j". Self-loops are allowed (a uniformly random
permutation has fixed points); repeated edges are not.

    g = random_graph(256, "permutation", seed=0)       # edges (i, pi(i))
    g = random_graph(128, "r-regular", degree=4, seed=0)
    matchings = konig_edge_coloring(g)                  # Delta matchings (Lemma B.8)
    blocks = pack_matchings(g, block_size=32)           # <= ceil(m'/B) + Delta blocks
    blocks = pack_matchings(g, num_blocks=8)            # exactly 8 blocks
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Optional

import networkx as nx
import torch

GRAPH_KINDS = ("permutation", "r-regular", "erdos-renyi")
_LAYER_REDRAWS = 100


@dataclass(frozen=True, eq=False)
class RelationGraph:
    """A directed graph on items 0..m-1.

    Attributes:
        num_items: m >= 2.
        edges: (m', 2) int64, rows (source, target), unique, sorted by (source, target).
        kind: how it was made ("permutation", "r-regular", "erdos-renyi" or "custom").

    Build one with ``RelationGraph.from_edges``, ``from_permutation``, ``from_networkx``
    or ``random_graph``; construction validates the edge list.
    """

    num_items: int
    edges: torch.Tensor
    kind: str = "custom"

    def __post_init__(self) -> None:
        _check_num_items(self.num_items)
        e = self.edges
        if not isinstance(e, torch.Tensor):
            raise TypeError(f"edges must be a torch.Tensor of shape (num_edges, 2), got {type(e).__name__}")
        if e.dtype.is_floating_point or e.dtype.is_complex or e.dtype == torch.bool:
            raise TypeError(f"edges must be an integer tensor, got {e.dtype}")
        if e.dim() != 2 or e.shape[1] != 2:
            raise ValueError(f"edges must have shape (num_edges, 2) with rows (source, target), got {tuple(e.shape)}")
        if e.numel() and (int(e.min()) < 0 or int(e.max()) >= self.num_items):
            raise ValueError(f"edges must name items in [0, {self.num_items}), "
                             f"got range [{int(e.min())}, {int(e.max())}]")
        e = e.to(device="cpu", dtype=torch.int64)
        flat = e[:, 0] * self.num_items + e[:, 1]
        order = torch.argsort(flat)
        flat = flat[order]
        repeated = torch.nonzero(flat[1:] == flat[:-1]).flatten()
        if repeated.numel():
            k = int(flat[int(repeated[0])])
            raise ValueError(f"edges has the edge ({k // self.num_items}, {k % self.num_items}) twice; "
                             "a relational graph has at most one edge per ordered pair")
        object.__setattr__(self, "edges", e[order].contiguous())

    # --------------------------------------------------------------- constructors

    @classmethod
    def from_edges(cls, edges, num_items: int, kind: str = "custom") -> "RelationGraph":
        """From (m', 2) integer edges (tensor, array or list of pairs) on items 0..num_items-1."""
        if not isinstance(edges, torch.Tensor):
            edges = torch.as_tensor(edges, dtype=torch.int64)
            if edges.numel() == 0:
                edges = edges.reshape(0, 2)
        return cls(num_items, edges, kind)

    @classmethod
    def from_permutation(cls, permutation: torch.Tensor) -> "RelationGraph":
        """Edges (i, permutation[i]) for a (m,) integer tensor holding a permutation of 0..m-1."""
        if not isinstance(permutation, torch.Tensor):
            raise TypeError(f"permutation must be a torch.Tensor, got {type(permutation).__name__}")
        if permutation.dim() != 1:
            raise ValueError(f"permutation must be 1-D, got shape {tuple(permutation.shape)}")
        m = permutation.shape[0]
        perm = permutation.to("cpu", torch.int64)
        if not torch.equal(torch.sort(perm).values, torch.arange(m)):
            raise ValueError(f"permutation must hold each of 0..{m - 1} exactly once")
        return cls(m, torch.stack([torch.arange(m), perm], dim=1), "permutation")

    @classmethod
    def from_networkx(cls, graph: nx.DiGraph) -> "RelationGraph":
        """From a networkx DiGraph whose nodes are exactly 0..m-1."""
        if not isinstance(graph, nx.DiGraph) or graph.is_multigraph():
            raise TypeError("graph must be a networkx DiGraph (directed, no parallel edges), "
                            f"got {type(graph).__name__}")
        m = graph.number_of_nodes()
        if set(graph.nodes) != set(range(m)):
            raise ValueError("graph nodes must be the integers 0..m-1; relabel with nx.convert_node_labels_to_integers")
        return cls.from_edges(list(graph.edges), m)

    def to_networkx(self) -> nx.DiGraph:
        """The same graph as a networkx DiGraph on nodes 0..m-1."""
        g = nx.DiGraph()
        g.add_nodes_from(range(self.num_items))
        g.add_edges_from(map(tuple, self.edges.tolist()))
        return g

    # --------------------------------------------------------------- views

    @property
    def num_edges(self) -> int:
        """m' = |E|."""
        return int(self.edges.shape[0])

    @cached_property
    def adjacency(self) -> torch.Tensor:
        """(m, m) bool, adjacency[i, j] iff (i, j) is an edge. Shared: do not modify."""
        a = torch.zeros(self.num_items, self.num_items, dtype=torch.bool)
        a[self.edges[:, 0], self.edges[:, 1]] = True
        return a

    @property
    def out_degree(self) -> torch.Tensor:
        """(m,) int64 out-degrees."""
        return torch.bincount(self.edges[:, 0], minlength=self.num_items)

    @property
    def in_degree(self) -> torch.Tensor:
        """(m,) int64 in-degrees."""
        return torch.bincount(self.edges[:, 1], minlength=self.num_items)

    @property
    def max_degree(self) -> int:
        """Delta = max(max out-degree, max in-degree)."""
        if self.num_edges == 0:
            return 0
        return int(max(self.out_degree.max(), self.in_degree.max()))

    @property
    def is_permutation(self) -> bool:
        """True when every item has exactly one out-edge and one in-edge."""
        return bool((self.out_degree == 1).all() and (self.in_degree == 1).all())

    @cached_property
    def successor(self) -> torch.Tensor:
        """(m,) int64 pi with edges (i, pi(i)); only for permutation graphs."""
        if not self.is_permutation:
            raise ValueError("successor needs a permutation graph (one out-edge and one in-edge per item)")
        return self.edges[:, 1].clone()  # edges are sorted by source, one per source

    @cached_property
    def out_neighbors(self) -> torch.Tensor:
        """(m, r) int64 out-neighbours of every item, ascending; needs equal out-degrees r >= 1
        (permutation graphs: r = 1, the column is ``successor``; r-regular graphs)."""
        degree = self.out_degree
        if self.num_edges == 0 or not bool((degree == degree[0]).all()):
            raise ValueError("out_neighbors needs every item to have the same out-degree r >= 1 "
                             "(a permutation or r-regular graph)")
        return self.edges[:, 1].reshape(self.num_items, -1).clone()  # edges sorted by (source, target)

    def __repr__(self) -> str:
        return (f"RelationGraph(kind={self.kind!r}, num_items={self.num_items}, num_edges={self.num_edges}, "
                f"max_degree={self.max_degree})")


def _check_num_items(m) -> None:
    if isinstance(m, bool) or not isinstance(m, int):
        raise TypeError(f"m (number of items) must be an int, got {type(m).__name__}")
    if m < 2:
        raise ValueError(f"m (number of items) must be at least 2, got {m}")


def check_graph(graph) -> RelationGraph:
    """Return ``graph`` if it is a RelationGraph, else raise a TypeError saying how to make one."""
    if not isinstance(graph, RelationGraph):
        raise TypeError(f"graph must be a RelationGraph (see random_graph, RelationGraph.from_edges / "
                        f"from_permutation / from_networkx), got {type(graph).__name__}")
    return graph


# ----------------------------------------------------------------------------- random families


def _generator(seed: Optional[int], generator: Optional[torch.Generator]) -> torch.Generator:
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        return generator
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int (or pass generator=), got {type(seed).__name__}")
    return torch.Generator().manual_seed(seed)


def random_graph(m: int, kind: str = "permutation", *, degree: Optional[int] = None,
                 edge_prob: Optional[float] = None, seed: Optional[int] = 0,
                 generator: Optional[torch.Generator] = None) -> RelationGraph:
    """A random relational graph on m items.

    kind:
      "permutation"  edges (i, pi(i)) for a uniformly random permutation pi (m' = m; fixed
                     points give self-loops), the seed's main testbed.
      "r-regular"    every item has exactly ``degree`` (default 2) out- and in-neighbours, no
                     self-loops: the union of ``degree`` random permutations, each drawn
                     uniformly and then repaired by random swaps wherever it would repeat an
                     edge or make a self-loop (App. A.3: "union of r random perfect matchings");
                     above half density, the complement of such a graph.
      "erdos-renyi"  each ordered pair i != j is an edge with probability ``edge_prob``
                     (default degree / (m - 1), i.e. expected out-degree ``degree``, default 2).

    Same seed (or same generator state), same graph.
    """
    _check_num_items(m)
    if kind not in GRAPH_KINDS:
        raise ValueError(f"kind must be one of {GRAPH_KINDS}, got {kind!r}")
    gen = _generator(seed, generator)
    if kind == "permutation":
        if degree not in (None, 1) or edge_prob is not None:
            raise ValueError("a permutation graph has degree 1; do not pass degree or edge_prob")
        return RelationGraph.from_permutation(torch.randperm(m, generator=gen))
    degree = 2 if degree is None else degree
    if isinstance(degree, bool) or not isinstance(degree, int) or not 1 <= degree <= m - 1:
        raise ValueError(f"degree must be an int in [1, m - 1] = [1, {m - 1}], got {degree!r}")
    if kind == "r-regular":
        if edge_prob is not None:
            raise ValueError("edge_prob is for kind='erdos-renyi'; an r-regular graph takes degree")
        return _random_regular(m, degree, gen)
    p = degree / (m - 1) if edge_prob is None else edge_prob
    if not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"edge_prob must be a probability in [0, 1], got {p!r}")
    a = torch.rand(m, m, generator=gen) < p
    a.fill_diagonal_(False)
    return RelationGraph(m, torch.nonzero(a), "erdos-renyi")


def _random_regular(m: int, degree: int, gen: torch.Generator) -> RelationGraph:
    """Union of ``degree`` permutations with no self-loop and no repeated edge.

    Each layer is a uniform random permutation whose forbidden entries (self-loops, edges
    already drawn) are repaired by random swaps; a layer that cannot be repaired is
    redrawn. Above half density the complement, an (m - 1 - degree)-regular graph, is
    drawn instead, so layers always have room.
    """
    sparse = min(degree, m - 1 - degree)
    taken = torch.eye(m, dtype=torch.bool)  # forbidden (source, target) pairs: self-loops and used edges
    sources = torch.arange(m)
    for _ in range(sparse):
        for _redraw in range(_LAYER_REDRAWS):
            target = _repaired_permutation(taken, gen)
            if target is not None:
                break
        else:
            raise RuntimeError(f"could not draw a {degree}-regular graph on {m} items")
        taken[sources, target] = True
    if sparse < degree:
        taken = ~taken
    taken.fill_diagonal_(False)
    return RelationGraph(m, torch.nonzero(taken), "r-regular")


def _repaired_permutation(taken: torch.Tensor, gen: torch.Generator) -> Optional[torch.Tensor]:
    """A random permutation avoiding ``taken`` (m, m) pairs, or None if random swaps cannot repair it."""
    m = taken.shape[0]
    target = torch.randperm(m, generator=gen)
    for i in torch.nonzero(taken[torch.arange(m), target]).flatten().tolist():
        if not taken[i, target[i]]:
            continue  # repaired by an earlier swap
        candidates = torch.randperm(m, generator=gen)
        legal = candidates[~taken[i, target[candidates]] & ~taken[candidates, target[i]]]  # swap i <-> j allowed
        if legal.numel() == 0:
            return None
        j = int(legal[0])
        target[i], target[j] = target[j].clone(), target[i].clone()
    return target


# ----------------------------------------------------------------------------- edge colouring


def konig_edge_coloring(graph: RelationGraph) -> list[torch.Tensor]:
    """Split E into Delta matchings (König's line-colouring theorem, as in Lemma B.8).

    A directed edge (i, j) is the edge {i on the left, j on the right} of a bipartite
    graph of maximum degree Delta, which has a proper edge colouring with Delta colours.
    Each edge gets the colour a free at its source if that is also free at its target;
    otherwise the a/b alternating path from the target (b free there) is flipped first.

    Returns a list of Delta tensors (k_c, 2) int64, rows (source, target): within one,
    no two edges share a source or a target. Empty colour classes are dropped.
    """
    check_graph(graph)
    delta = graph.max_degree
    # at[side][vertex] maps colour -> the vertex at the other end of that coloured edge
    at: tuple[list[dict], list[dict]] = ([{} for _ in range(graph.num_items)], [{} for _ in range(graph.num_items)])

    def free(side: int, v: int) -> int:
        return next(c for c in range(delta) if c not in at[side][v])

    for source, target in graph.edges.tolist():
        a, b = free(0, source), free(1, target)
        if a in at[1][target]:
            _flip_path(at, target, a, b)
        at[0][source][a] = target
        at[1][target][a] = source
    classes = [[] for _ in range(delta)]
    for source, colours in enumerate(at[0]):
        for c, target in colours.items():
            classes[c].append((source, target))
    return [torch.tensor(sorted(c), dtype=torch.int64) for c in classes if c]


def _flip_path(at: tuple[list[dict], list[dict]], start: int, a: int, b: int) -> None:
    """Swap colours a and b on the a/b alternating path that leaves right vertex ``start`` by colour a."""
    path = []  # (left, right, colour)
    side, v, colour = 1, start, a
    while colour in at[side][v]:
        w = at[side][v][colour]
        path.append((w, v, colour) if side == 1 else (v, w, colour))
        side, v, colour = 1 - side, w, (b if colour == a else a)
    for left, right, c in path:
        del at[0][left][c]
        del at[1][right][c]
    for left, right, c in path:
        other = b if c == a else a
        at[0][left][other] = right
        at[1][right][other] = left


def pack_matchings(graph: RelationGraph, block_size: Optional[int] = None,
                   num_blocks: Optional[int] = None) -> list[torch.Tensor]:
    """Lemma B.8: cut the König colour classes into matchings ("blocks"), one per head.

    Give exactly one of
      block_size  B: each colour class of n edges becomes ceil(n / B) blocks of at most B
                  edges, so there are at most ceil(m'/B) + Delta blocks (Lemma B.8);
      num_blocks  h: exactly h blocks (Delta <= h <= m'), given to the colour classes so
                  that the largest block is as small as possible.
    Each class is cut, in source order, into near-equal consecutive pieces; for a
    permutation graph this is Algorithm 1's split of the sources into blocks V_1..V_h.

    Returns a list of (k, 2) int64 tensors, rows (source, target).
    """
    check_graph(graph)
    if (block_size is None) == (num_blocks is None):
        raise ValueError("give exactly one of block_size and num_blocks")
    classes = konig_edge_coloring(graph)
    sizes = [int(c.shape[0]) for c in classes]
    if block_size is not None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        pieces = [math.ceil(n / block_size) for n in sizes]
    else:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int):
            raise TypeError(f"num_blocks (heads) must be an int, got {type(num_blocks).__name__}")
        if not len(classes) <= num_blocks <= graph.num_edges:
            raise ValueError(f"num_blocks (heads) must lie in [Delta, m'] = [{len(classes)}, {graph.num_edges}] "
                             f"for this graph, got {num_blocks}")
        pieces = [1] * len(classes)
        for _ in range(num_blocks - len(classes)):  # one more piece where the largest block is
            c = max(range(len(classes)), key=lambda i: math.ceil(sizes[i] / pieces[i]))
            pieces[c] += 1
    return [block for matching, k in zip(classes, pieces) for block in torch.tensor_split(matching, k)]


def matching_head_bound(graph: RelationGraph, block_size: int) -> int:
    """Lemma B.8's head count H = ceil(m' / B) + Delta."""
    return math.ceil(graph.num_edges / block_size) + graph.max_degree
