"""Importers of classic machine-learning ops: TfIdfVectorizer and some `ai.onnx.ml` ops.

The `ai.onnx.ml` ones are Binarizer, ArrayFeatureExtractor and TreeEnsemble.

Their tables (n-gram pools, trees) are attributes, so they unfold into comparisons: an n-gram
count is a sum of matches over the sliding positions, and a tree ensemble is, per leaf, the
conjunction of the decisions on its path.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx

from knopt.errors import UnsupportedModelError
from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Binary, Reduction, Unary
from knopt.ir.shape import numel
from knopt.onnx.context import Attributes, ImportContext, OnnxValue, importer
from knopt.onnx.ops.common import scalar_like, static_dim

ML = "ai.onnx.ml"


# ---- TfIdfVectorizer ---------------------------------------------------------------------


def _pool_ngrams(
    attrs: Attributes, low: int, high: int
) -> tuple[list[tuple[int, np.ndarray]], int]:
    """The pool's n-grams of sizes `low..high`, and how many n-grams the pool holds in all.

    Each group is (the global index of its first n-gram, the n-grams `[G, n]`).

    Raises:
        UnsupportedModelError: If `ngram_counts` does not split the pool into whole n-grams.
    """
    pool = np.array(attrs.ints("pool_int64s"), np.int64)
    starts = attrs.ints("ngram_counts")
    groups, first = [], 0
    for size, start in enumerate(starts, start=1):
        end = starts[size] if size < len(starts) else pool.size
        if not 0 <= start <= end <= pool.size or (end - start) % size:
            raise UnsupportedModelError(
                f"{attrs.where}: ngram_counts {starts} do not split the {pool.size} pool entries "
                "into whole n-grams"
            )
        grams = pool[start:end].reshape(-1, size)
        if low <= size <= high and len(grams):
            groups.append((first, grams))
        first += len(grams)
    return groups, first


def _count(ctx: ImportContext, x: Value, grams: np.ndarray, distance: int) -> Value | None:
    """How often each n-gram `[G, n]` occurs in each row of `x [N, C]` with this spacing."""
    b = ctx.builder
    count, size = grams.shape
    length = static_dim(ctx, x.shape[1], "TfIdfVectorizer") - (size - 1) * distance
    if length <= 0:
        return None
    match = None
    for j in range(size):
        window = b.slice(x, axis=1, start=j * distance, stop=j * distance + length)
        hits = b.binary(
            Binary.EQUAL,
            b.view(window, (x.shape[0], length, 1)),
            b.constant(grams[:, j].astype(x.dtype.numpy)),
        )
        match = hits if match is None else b.binary(Binary.AND, match, hits)
    assert match is not None
    return b.view(b.reduce(Reduction.SUM, b.cast(match, DType.F32), axes=[1]), (x.shape[0], count))


@importer("TfIdfVectorizer", since=9)
def _tfidf_vectorizer(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    mode = attrs.string("mode")
    low, high = attrs.int("min_gram_length"), attrs.int("max_gram_length")
    skips = attrs.int("max_skip_count", 0)
    columns = attrs.ints("ngram_indexes")
    weights = attrs.floats("weights", [])
    if mode not in ("TF", "IDF", "TFIDF") or not x.dtype.is_int:
        raise ctx.fail("TfIdfVectorizer needs mode TF, IDF or TFIDF and integer input")
    b = ctx.builder
    rows = x if x.rank == 2 else b.view(x, (1, x.shape[0]))
    groups, total = _pool_ngrams(attrs, low, high)
    if len(columns) != total or min(columns, default=0) < 0:
        raise ctx.fail(
            f"ngram_indexes {columns} must give an output column (0 or more) to each of the "
            f"pool's {total} n-grams"
        )
    width = max(columns, default=-1) + 1
    counts = None
    for first, grams in groups:
        # Unigrams count once; longer n-grams once per spacing 1..max_skip_count + 1.
        for distance in range(1, (1 if grams.shape[1] == 1 else skips + 1) + 1):
            found = _count(ctx, rows, grams, distance)
            if found is None:
                continue
            scatter = np.zeros((len(grams), width), np.float32)
            scatter[np.arange(len(grams)), [columns[first + g] for g in range(len(grams))]] = 1
            part = b.matmul(found, b.constant(scatter))
            counts = part if counts is None else b.add(counts, part)
    if counts is None:
        counts = b.scalar(0.0, DType.F32, (rows.shape[0], width))
    if mode == "IDF":
        counts = b.cast(b.binary(Binary.GREATER, counts, scalar_like(ctx, counts, 0)), DType.F32)
    if mode != "TF" and weights:
        counts = b.mul(counts, b.constant(np.array(weights, np.float32)))
    return [counts if x.rank == 2 else b.view(counts, (width,))]


# ---- ai.onnx.ml ------------------------------------------------------------------------------


@importer("Binarizer", domain=ML)
def _binarizer(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    threshold = ctx.attributes(node).float("threshold", 0.0)
    b = ctx.builder
    return [b.cast(b.binary(Binary.GREATER, x, scalar_like(ctx, x, threshold)), x.dtype)]


@importer("ArrayFeatureExtractor", domain=ML)
def _array_feature_extractor(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, indices = ctx.inputs(node, count=2)
    ctx.attributes(node)
    b = ctx.builder
    flat = b.view(indices, (numel(indices.shape),))
    picked = b.gather(x, flat, axis=x.rank - 1)
    return [picked if x.rank > 1 else b.view(picked, (1, flat.shape[0]))]


# nodes_modes codes: 0 <=, 1 <, 2 >=, 3 >, 4 ==, 5 !=, 6 set membership.
_COMPARE = {
    0: Binary.LESS_EQUAL,
    1: Binary.LESS,
    2: Binary.GREATER_EQUAL,
    3: Binary.GREATER,
    4: Binary.EQUAL,
}


def _decision(ctx: ImportContext, x: Value, node: int, tree: dict[str, list]) -> Value:
    """Whether each row of `x` takes the true branch at tree node `node`."""
    b = ctx.builder
    column = b.view(
        b.slice(x, axis=1, start=tree["features"][node], stop=tree["features"][node] + 1),
        (x.shape[0],),
    )
    mode = tree["modes"][node]
    if mode == 6:  # set membership
        members = b.constant(np.array(tree["members"][node], x.dtype.numpy))
        hits = b.binary(Binary.EQUAL, b.view(column, (x.shape[0], 1)), members)
        taken = b.cast(b.reduce(Reduction.MAX, b.cast(hits, DType.U8), axes=[1]), DType.BOOL)
        taken = b.view(taken, (x.shape[0],))
    elif mode == 5:
        taken = b.unary(
            Unary.NOT, b.binary(Binary.EQUAL, column, scalar_like(ctx, x, tree["splits"][node]))
        )
    else:
        taken = b.binary(_COMPARE[mode], column, scalar_like(ctx, x, tree["splits"][node]))
    if tree["missing"][node]:
        taken = b.binary(Binary.OR, taken, b.unary(Unary.IS_NAN, column))
    return taken


def _leaves(
    ctx: ImportContext, x: Value, tree: dict[str, list], root: int
) -> list[tuple[int, Value | None]]:
    """Every leaf under `root` with the condition (per row) of reaching it."""
    found: list[tuple[int, Value | None]] = []
    stack: list[tuple[int, bool, Value | None]] = [(root, False, None)]
    b = ctx.builder
    while stack:
        node, is_leaf, path = stack.pop()
        if is_leaf:
            found.append((node, path))
            continue
        taken = _decision(ctx, x, node, tree)
        for branch, condition in (("true", taken), ("false", b.unary(Unary.NOT, taken))):
            joined = condition if path is None else b.binary(Binary.AND, path, condition)
            stack.append((tree[f"{branch}_ids"][node], bool(tree[f"{branch}_leafs"][node]), joined))
    return found


def _tree_tables(attrs: Attributes) -> dict[str, list]:
    """The node tables of a TreeEnsemble, by name; membership sets by node index."""
    splits = attrs.tensor("nodes_splits")
    membership = attrs.tensor("membership_values")
    mode_table = attrs.tensor("nodes_modes")
    if mode_table is not None and mode_table.dtype.kind not in "iu":  # uint8 codes
        raise UnsupportedModelError(
            f"{attrs.where}: attribute 'nodes_modes' must hold integers, not {mode_table.dtype}"
        )
    modes = [] if mode_table is None else [int(m) for m in mode_table.reshape(-1)]
    members: dict[int, list[float]] = {}
    if membership is not None:  # NaN-separated sets, one per membership node in order
        sets = np.split(membership, np.where(np.isnan(membership))[0] + 1)
        for index, values in zip([i for i, m in enumerate(modes) if m == 6], sets, strict=False):
            members[index] = [v for v in values.tolist() if v == v]
    attrs.skip("nodes_hitrates")  # statistics for runtimes; no effect on the result
    return {
        "splits": [] if splits is None else splits.tolist(),
        "features": attrs.ints("nodes_featureids"),
        "modes": modes,
        "true_ids": attrs.ints("nodes_truenodeids"),
        "false_ids": attrs.ints("nodes_falsenodeids"),
        "true_leafs": attrs.ints("nodes_trueleafs"),
        "false_leafs": attrs.ints("nodes_falseleafs"),
        "missing": attrs.ints("nodes_missing_value_tracks_true", [0] * len(modes)),
        "members": members,
    }


@importer("TreeEnsemble", since=5, domain=ML)
def _tree_ensemble(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    aggregate = attrs.int("aggregate_function", 1)  # 0 average, 1 sum, 2 min, 3 max
    if attrs.int("post_transform", 0) != 0 or aggregate not in (0, 1, 2, 3):
        raise ctx.fail("TreeEnsemble post_transform must be NONE")
    tree = _tree_tables(attrs)
    weights = attrs.tensor("leaf_weights")
    assert weights is not None, "leaf_weights is a required attribute"
    targets, roots = attrs.ints("leaf_targetids"), attrs.ints("tree_roots")
    count = attrs.int("n_targets")
    b = ctx.builder
    rows = x.shape[0]
    info = ml_dtypes.finfo(x.dtype.numpy)
    fill = {0: 0.0, 1: 0.0, 2: float(info.max), 3: float(info.min)}
    result = b.scalar(fill[aggregate], x.dtype, (rows, count))
    for root in roots:
        single = tree["true_leafs"][root] and tree["false_leafs"][root]
        single = single and tree["true_ids"][root] == tree["false_ids"][root]
        leaves = [(tree["true_ids"][root], None)] if single else _leaves(ctx, x, tree, root)
        for leaf, path in leaves:
            value = scalar_like(ctx, x, float(weights[leaf]) / (len(roots) if not aggregate else 1))
            hot = np.zeros((1, count), bool)
            hot[0, targets[leaf]] = True
            reached = b.constant(hot)
            if path is not None:
                reached = b.binary(Binary.AND, b.view(path, (rows, 1)), reached)
            if aggregate in (0, 1):
                result = b.add(result, b.where(reached, value, scalar_like(ctx, x, 0)))
            else:
                kind = Binary.MIN if aggregate == 2 else Binary.MAX
                result = b.where(reached, b.binary(kind, result, value), result)
    return [result]
