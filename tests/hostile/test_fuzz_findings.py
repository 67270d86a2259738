"""What the mutation fuzzer found (tests/testing/test_mutation.py), each as a small model.

Each of these raised IndexError, AssertionError, ValueError, ZeroDivisionError, TypeError or
ran out of memory while loading; each must now be one typed error naming the node.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import ModelProto, TensorProto, helper, numpy_helper

import knopt
from knopt.errors import KnoptError, RunError
from knopt.ir import GraphBuilder
from knopt.ir.dtype import DType
from tests.hostile.builders import I64, info, ints, model
from tests.oracle import run_onnxruntime, run_reference


def _shape_of_x(*nodes: onnx.NodeProto, x: list[int | str] | None = None) -> onnx.ModelProto:
    """`s = Shape(x)` followed by `nodes`, whose last output is `y`."""
    shape = helper.make_node("Shape", ["x"], ["s"], name="shape")
    return model([shape, *nodes], [info("x", x or ["n", 4])], [info("y", None, I64)])


FLOATS = numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "two")


def _doubles(name: str, values: object) -> TensorProto:
    """A float64 initializer: what an int64 one reads as when its data type is changed."""
    return numpy_helper.from_array(np.array(values, np.float64), name)


def _looped(trips: TensorProto) -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Neg", ["a"], ["b"])],
        "body",
        [info("i", [], I64), info("c", [], onnx.TensorProto.BOOL), info("a", [2])],
        [info("c_out", [], onnx.TensorProto.BOOL), info("b", [2])],
    )
    loop = helper.make_node("Loop", ["m", "", "x"], ["y"], body=body, name="l")
    return model([loop], [info("x", [2])], [info("y", None)], [trips])


CASES: dict[str, tuple[onnx.ModelProto, str]] = {
    "input_missing": (
        model(
            [helper.make_node("Unsqueeze", ["x"], ["y"], name="u")],
            [info("x", [2])],
            [info("y", None)],
        ),
        "node 'u'.*takes 2 inputs, got 1",
    ),
    "output_extra": (
        model(
            [helper.make_node("Relu", ["x"], ["y", "z"], name="r")],
            [info("x", [2])],
            [info("y", None)],
        ),
        "node 'r'.*takes 1 outputs, got 2",
    ),
    "axes_from_sizes": (
        _shape_of_x(helper.make_node("Unsqueeze", ["s", "s"], ["y"], name="u")),
        "node 'u'",
    ),
    "size_index_out_of_range": (
        model(
            [
                helper.make_node("Shape", ["x"], ["s"], name="shape"),
                helper.make_node("Gather", ["s", "i"], ["y"], name="g"),
            ],
            [info("x", ["n", 4])],
            [info("y", None, I64)],
            [ints("i", 255)],
        ),
        "node 'g'.*out of range",
    ),
    "clip_bound_of_two_values": (
        model(
            [helper.make_node("Clip", ["x", "two"], ["y"], name="c")],
            [info("x", [2])],
            [info("y", None)],
            [FLOATS],
        ),
        "node 'c'.*must hold one value, not 2",
    ),
    "conv_stride_zero": (
        model(
            [helper.make_node("Conv", ["x", "w"], ["y"], name="c", strides=[1, 0])],
            [info("x", [1, 1, 4, 4])],
            [info("y", None)],
            [numpy_helper.from_array(np.ones((1, 1, 2, 2), np.float32), "w")],
        ),
        "node 'c'.*stride 0",
    ),
    "gather_nd_batch_beyond_rank": (
        model(
            [helper.make_node("GatherND", ["x", "i"], ["y"], name="g", batch_dims=2)],
            [info("x", [2, 3])],
            [info("y", None)],
            [ints("i", [[0], [1]])],
        ),
        "node 'g'.*batch_dims 2",
    ),
    "huge_static_size_beside_a_symbolic_one": (
        model(
            [helper.make_node("Relu", ["x"], ["y"], name="r")],
            [info("x", ["n", 2**31 - 1, 2**20])],
            [info("y", None)],
        ),
        "graph input 'x'",
    ),
    "resize_to_a_billion_positions": (
        model(
            [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="r")],
            [info("x", [1, 1, 2])],
            [info("y", None)],
            [ints("sizes", [1, 1, 2**30])],
        ),
        "node 'r'.*2\\^20|node 'r'.*memory limit|node 'r'.*at most",
    ),
    "top_k_of_two_values": (
        model(
            [helper.make_node("TopK", ["x", "k"], ["y", "i"], name="t")],
            [info("x", [4])],
            [info("y", None)],
            [ints("k", [1, 2])],
        ),
        "node 't'.*must hold one value",
    ),
    "reshape_of_sizes_that_do_not_fit": (
        model(
            [
                helper.make_node("Shape", ["x"], ["s"], name="shape"),
                helper.make_node("Reshape", ["s", "t"], ["y"], name="r"),
            ],
            [info("x", ["n", 4])],
            [info("y", None, I64)],
            [ints("t", [3])],
        ),
        "node 'r'",
    ),
    "concat_of_sizes_of_different_ranks": (
        model(
            [
                helper.make_node("Shape", ["x"], ["s"], name="shape"),
                helper.make_node("Concat", ["s", "m"], ["y"], name="c", axis=0),
            ],
            [info("x", ["n", 4])],
            [info("y", None, I64)],
            [ints("m", [[1, 2]])],
        ),
        "node 'c'",
    ),
    "slice_lists_of_different_lengths": (
        model(
            [helper.make_node("Slice", ["x", "a", "b", "c"], ["y"], name="s")],
            [info("x", [4, 4])],
            [info("y", None)],
            [ints("a", [0, 0]), ints("b", [2]), ints("c", [0, 1])],
        ),
        "node 's'.*differ in length",
    ),
    "required_input_without_a_name": (
        model(
            [helper.make_node("Gather", ["", "i"], ["y"], name="g")],
            [],
            [info("y", None)],
            [ints("i", [0])],
        ),
        "node 'g'.*input 0 \\(data\\) is required",
    ),
    "loop_without_a_body": (
        model(
            [helper.make_node("Loop", ["m", "", "x"], ["y"], name="l")],
            [info("x", [2])],
            [info("y", None)],
            [ints("m", 2)],
        ),
        "node 'l'.*required attribute\\(s\\) body",
    ),
    "if_branches_of_different_lengths": (
        model(
            [
                helper.make_node(
                    "If",
                    ["c"],
                    ["y"],
                    name="if",
                    then_branch=helper.make_graph(
                        [helper.make_node("Neg", ["x"], ["t"])], "t", [], [info("t", [2])]
                    ),
                    else_branch=helper.make_graph(
                        [
                            helper.make_node("Neg", ["x"], ["e"]),
                            helper.make_node("Relu", ["x"], ["f"]),
                        ],
                        "e",
                        [],
                        [info("e", [2]), info("f", [2])],
                    ),
                )
            ],
            [info("x", [2]), info("c", [], onnx.TensorProto.BOOL)],
            [info("y", None)],
        ),
        "node 'if'.*1 and 2 outputs",
    ),
    "concat_of_scalars": (
        model(
            [helper.make_node("Concat", ["a", "b"], ["y"], name="c", axis=0)],
            [],
            [info("y", None, I64)],
            [ints("a", 1), ints("b", 2)],
        ),
        "node 'c'.*not scalars",
    ),
    "concat_of_a_size_and_a_scalar": (
        model(
            [
                helper.make_node("Shape", ["x"], ["s"], name="shape"),
                helper.make_node("Gather", ["s", "i"], ["n"], name="batch"),
                helper.make_node("Concat", ["n", "n"], ["y"], name="c", axis=0),
            ],
            [info("x", ["n", 4])],
            [info("y", None, I64)],
            [ints("i", 0)],
        ),
        "node 'c'.*not scalars",
    ),
    "instance_norm_of_a_vector": (
        model(
            [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], name="n")],
            [info("x", [4]), info("s", [4]), info("b", [4])],
            [info("y", None)],
        ),
        "node 'n'.*rank 3 or more",
    ),
    "depth_to_space_of_rank_3": (
        model(
            [helper.make_node("DepthToSpace", ["x"], ["y"], name="d", blocksize=2)],
            [info("x", [1, 8, 2])],
            [info("y", None)],
        ),
        "node 'd'.*rank 4, not 3",
    ),
    "reversed_slice_from_a_symbolic_start": (
        model(
            [
                helper.make_node("Shape", ["x"], ["s"], name="shape"),
                helper.make_node("Slice", ["v", "s", "end", "zero", "back"], ["y"], name="s"),
            ],
            [info("x", ["n"]), info("v", [5])],
            [info("y", None)],
            [ints("end", [0]), ints("zero", [0]), ints("back", [-1])],
        ),
        "node 's'.*static starts and ends",
    ),
    "range_of_two_values": (
        model(
            [helper.make_node("Range", ["a", "b", "c"], ["y"], name="r")],
            [],
            [info("y", None, I64)],
            [ints("a", [0, 1]), ints("b", 5), ints("c", 1)],
        ),
        "node 'r'.*one value each",
    ),
    # Integer inputs of a floating type: int() of NaN (mutants 101-10023, 101-10903), and
    # silently truncated values otherwise. ONNX declares every one of them int32 or int64.
    "reshape_to_a_double_shape": (
        model(
            [helper.make_node("Reshape", ["x", "t"], ["y"], name="r")],
            [info("x", [2, 4])],
            [info("y", None)],
            [_doubles("t", [np.nan, 4])],
        ),
        "node 'r'.*input 1 \\(shape\\) must hold integers, not f64",
    ),
    "reduce_over_double_axes": (
        model(
            [helper.make_node("ReduceMean", ["x", "a"], ["y"], name="m")],
            [info("x", [2, 4])],
            [info("y", None)],
            [_doubles("a", [np.nan])],
        ),
        "node 'm'.*input 1 \\(axes\\) must hold integers, not f64",
    ),
    "sizes_unsqueezed_by_double_axes": (
        model(
            [
                helper.make_node("Shape", ["x"], ["s"], name="shape"),
                helper.make_node("Unsqueeze", ["s", "a"], ["y"], name="u"),
            ],
            [info("x", ["n", 4])],
            [info("y", None, I64)],
            [_doubles("a", [np.nan])],
        ),
        "node 'u'.*input 1 \\(axes\\) must hold integers, not f64",
    ),
    "scatter_at_double_indices": (
        model(
            [helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], name="s")],
            [info("x", [4]), info("u", [1])],
            [info("y", None)],
            [_doubles("i", [1.5])],
        ),
        "node 's'.*indices must be integers, not f64",
    ),
    "loop_of_nan_trips": (_looped(_doubles("m", np.nan)), "node 'l'.*trip count.*not nan"),
    "resize_by_a_nan_scale": (
        model(
            [helper.make_node("Resize", ["x", "", "s"], ["y"], name="r")],
            [info("x", [1, 1, 2, 2])],
            [info("y", None)],
            [numpy_helper.from_array(np.array([1, 1, np.nan, 2], np.float32), "s")],
        ),
        "node 'r'.*scale nan must be positive and finite",
    ),
    "resize_of_an_empty_axis_to_four": (
        model(
            [helper.make_node("Resize", ["x", "", "", "n"], ["y"], name="r", mode="linear")],
            [info("x", [1, 1, 0, 2])],
            [info("y", None)],
            [ints("n", [1, 1, 4, 2])],
        ),
        "node 'r'.*empty axis",
    ),
    "range_whose_count_overflows": (
        model(
            [helper.make_node("Range", ["a", "b", "c"], ["y"], name="r")],
            [],
            [info("y", None, onnx.TensorProto.DOUBLE)],
            [_doubles("a", -1e308), _doubles("b", 1e308), _doubles("c", 1e-300)],
        ),
        "node 'r'.*inf elements",
    ),
    # Ranks beyond numpy's (mutant 101-9363 made a ConstantOfShape of 1024 axes).
    "constant_of_shape_of_1024_axes": (
        model(
            [helper.make_node("ConstantOfShape", ["s"], ["y"], name="c")],
            [],
            [info("y", None)],
            [ints("s", [1] * 1024)],
        ),
        "node 'c'.*input 0 \\(shape\\): 1024 axes, more than the 32",
    ),
    "sizes_reshaped_into_33_axes": (
        model(
            [
                helper.make_node("Shape", ["x"], ["s"], name="shape"),
                helper.make_node("Reshape", ["s", "t"], ["y"], name="r"),
            ],
            [info("x", ["n"])],
            [info("y", None, I64)],
            [ints("t", [1] * 33)],
        ),
        "node 'r'.*33 axes, more than the 32",
    ),
    "input_of_33_axes": (
        model(
            [helper.make_node("Relu", ["x"], ["y"], name="r")],
            [info("x", [1] * 33)],
            [info("y", None)],
        ),
        "graph input 'x': 33 axes",
    ),
    "tfidf_with_a_column_for_one_of_two_ngrams": (
        model(
            [
                helper.make_node(
                    "TfIdfVectorizer",
                    ["x"],
                    ["y"],
                    name="t",
                    mode="TF",
                    min_gram_length=1,
                    max_gram_length=1,
                    max_skip_count=0,
                    ngram_counts=[0],
                    ngram_indexes=[0],
                    pool_int64s=[4, 5],
                )
            ],
            [info("x", [4], I64)],
            [info("y", None)],
        ),
        "node 't'.*each of the pool's 2 n-grams",
    ),
    "tfidf_pool_not_in_whole_bigrams": (
        model(
            [
                helper.make_node(
                    "TfIdfVectorizer",
                    ["x"],
                    ["y"],
                    name="t",
                    mode="TF",
                    min_gram_length=1,
                    max_gram_length=2,
                    max_skip_count=0,
                    ngram_counts=[0, 1],
                    ngram_indexes=[0, 1],
                    pool_int64s=[4, 5, 6, 7],
                )
            ],
            [info("x", [4], I64)],
            [info("y", None)],
        ),
        "node 't'.*whole n-grams",
    ),
    # Axes of scalars and ranks nobody checked (the run of seed 202: IndexError each).
    "squeeze_of_a_scalar": (
        model(
            [helper.make_node("Squeeze", ["x", "a"], ["y"], name="s")],
            [info("x", [])],
            [info("y", None)],
            [ints("a", [0])],
        ),
        "node 's'.*axes \\[0\\] of a scalar",
    ),
    "gather_from_a_symbolic_size": (
        model(
            [
                helper.make_node("Shape", ["x"], ["s"], name="shape"),
                helper.make_node("Gather", ["s", "zero"], ["n"], name="batch"),
                helper.make_node("Gather", ["n", "zero"], ["y"], name="g"),
            ],
            [info("x", ["n", 4])],
            [info("y", None, I64)],
            [ints("zero", 0)],
        ),
        "node 'g'.*axis 0 of a scalar",
    ),
    "batch_norm_of_a_scalar_mean": (
        model(
            [helper.make_node("BatchNormalization", ["x", "c", "c", "m", "c"], ["y"], name="b")],
            [info("x", [1, 2, 3])],
            [info("y", None)],
            [
                numpy_helper.from_array(np.ones(2, np.float32), "c"),
                numpy_helper.from_array(np.array(0.5, np.float32), "m"),
            ],
        ),
        "node 'b'.*per-channel input.*must have rank 1, not 0",
    ),
    "gather_elements_by_a_scalar": (
        model(
            [helper.make_node("GatherElements", ["x", "i"], ["y"], name="g")],
            [info("x", [2, 3])],
            [info("y", None)],
            [ints("i", 0)],
        ),
        "node 'g'.*differ in rank",
    ),
    "gather_elements_wider_than_its_data": (
        model(
            [helper.make_node("GatherElements", ["x", "i"], ["y"], name="g", axis=0)],
            [info("x", [3, 2])],
            [info("y", None)],
            [ints("i", np.zeros((2, 3)))],
        ),
        "node 'g'.*reach beyond data f32\\[3, 2\\] on axis 1",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fuzzer_findings_are_typed_errors_naming_the_node(case: str) -> None:
    proto, pattern = CASES[case]
    with pytest.raises(KnoptError, match=pattern):
        knopt.load(proto.SerializeToString())


def test_an_opset_beyond_32_bits_still_loads() -> None:
    proto = model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], [info("x", [2])], [info("y", [2])]
    )
    proto.opset_import[0].version = 2**40
    (y,) = knopt.compile(proto.SerializeToString()).run(None, {"x": np.array([-1, 2], np.float32)})
    np.testing.assert_array_equal(y, [0, 2])


def _window_model(node: onnx.NodeProto, *initializers: onnx.TensorProto) -> onnx.ModelProto:
    return model([node], [info("x", [1, 2, 20, 20])], [info("y", None)], initializers)


WEIGHT = numpy_helper.from_array(np.full((3, 2, 2, 2), 0.5, np.float32), "w")
WINDOWS = {
    "max_pool_over_everything": _window_model(
        helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[20, 20])
    ),
    "average_pool_over_most_with_padding": _window_model(
        helper.make_node(
            "AveragePool", ["x"], ["y"], kernel_shape=[17, 19], pads=[1, 0, 2, 1], strides=[3, 2]
        )
    ),
    "conv_with_a_stride_of_2_to_63": _window_model(
        helper.make_node("Conv", ["x", "w"], ["y"], strides=[2**63 - 1, 1]), WEIGHT
    ),
    "conv_with_a_dilation_of_2_to_63_on_a_kernel_of_one": _window_model(
        helper.make_node("Conv", ["x", "w1"], ["y"], dilations=[2**63 - 1, 1]),
        numpy_helper.from_array(np.full((3, 2, 1, 2), 0.5, np.float32), "w1"),
    ),
}


@pytest.mark.parametrize("case", sorted(WINDOWS))
def test_windows_of_extreme_sizes_agree_with_onnxruntime(case: str) -> None:
    proto = WINDOWS[case]
    x = np.random.default_rng(9).standard_normal((1, 2, 20, 20)).astype(np.float32)
    (expected,) = run_onnxruntime(proto, {"x": x})
    (got,) = knopt.compile(proto.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_slice_parameters_given_as_scalars_are_read_as_lists() -> None:
    slicer = helper.make_node("Slice", ["x", "a", "b", "c", "d"], ["y"], name="s")
    params = [ints("a", [1]), ints("b", [7]), ints("c", 1), ints("d", 2)]
    proto = model([slicer], [info("x", [2, 8])], [info("y", None)], params)
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    (y,) = knopt.compile(proto.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(y, x[:, 1:7:2])


def test_a_pool_wider_than_its_padded_input_gives_an_empty_result() -> None:
    pool = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    proto = model([pool], [info("x", [1, 2, 4, 0])], [info("y", None)])
    (y,) = knopt.compile(proto.SerializeToString()).run(
        None, {"x": np.ones((1, 2, 4, 0), np.float32)}
    )
    assert y.shape == (1, 2, 4, 0)


NARROW_INTEGERS = (DType.U4, DType.I4, DType.U2, DType.I2)


def _narrow_model(node: onnx.NodeProto, dtype: DType, *initializers: TensorProto) -> ModelProto:
    outputs = [info(name, None, dtype) for name in node.output]
    if len(outputs) == 2:  # MaxPool's indices
        outputs[1] = info(node.output[1], None, I64)
    return model([node], [info("x", [1, 2, 4, 3], dtype)], outputs, initializers, opset=21)


# The reference evaluator pads integer pooling windows with -inf (a cast numpy warns about).
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("dtype", NARROW_INTEGERS, ids=lambda d: d.short)
@pytest.mark.parametrize("op", ["Resize", "MaxPool"])
def test_four_and_two_bit_integers_compute_as_the_reference_does(op: str, dtype: DType) -> None:
    # The limits of these types once came from numpy's iinfo, which knows none of them.
    if op == "Resize":  # linear weights of 1/4 and 3/4 are exact: ties round the same way
        scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
        node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", name="r")
        proto = _narrow_model(node, dtype, scales)
    else:
        node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], name="p")
        proto = _narrow_model(node, dtype)
    limits = ml_dtypes.iinfo(dtype.numpy)
    x = np.random.default_rng(5).integers(limits.min, limits.max + 1, (1, 2, 4, 3))
    got = knopt.compile(proto.SerializeToString()).run(None, {"x": x.astype(dtype.numpy)})
    (expected, *_) = run_reference(proto, {"x": x.astype(dtype.numpy)})
    assert got[0].dtype == expected.dtype
    np.testing.assert_array_equal(got[0].astype(np.int64), expected.astype(np.int64))
    if op == "MaxPool":  # the reference leaves the channel's offset out of the indices
        as_float = _narrow_model(node, DType.F32)
        (_, indices) = run_onnxruntime(as_float, {"x": x.astype(np.float32)})
        np.testing.assert_array_equal(got[1], indices)


def _over_an_empty_axis(op: str, dtype: int = onnx.TensorProto.FLOAT) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], name="e", axis=1)
    return model([node], [info("x", [3, 0])], [info("y", None, dtype)])


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_softmax_like_ops_of_an_empty_axis_agree_with_onnxruntime(op: str) -> None:
    # Mutant 101-7256 (a dim set to 0): numpy's max of an empty axis raised ValueError.
    proto, x = _over_an_empty_axis(op), np.zeros((3, 0), np.float32)
    (got,) = knopt.compile(proto.SerializeToString()).run(None, {"x": x})
    (expected,) = run_onnxruntime(proto, {"x": x})
    assert got.shape == expected.shape == (3, 0)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_the_index_of_the_largest_of_nothing_is_a_run_error_naming_the_node(op: str) -> None:
    session = knopt.compile(_over_an_empty_axis(op, I64).SerializeToString())
    with pytest.raises(RunError, match=r"node 'e'.*axis 1, which is empty"):
        session.run(None, {"x": np.zeros((3, 0), np.float32)})


def test_an_integer_product_over_an_empty_axis_saves_and_runs() -> None:
    # Saving took numpy's min of its empty weights to pick MatMulInteger (ValueError).
    b = GraphBuilder("empty")
    x = b.input("x", (2, 0), DType.U8)
    zero_point = b.cast(b.constant(np.array(3, np.uint8)), DType.I32)
    centered = b.sub(b.cast(x, DType.I32), zero_point)
    b.output(b.matmul(centered, b.constant(np.zeros((0, 3), np.int32))), "y")
    saved = knopt.save(b.build())
    assert [node.op_type for node in saved.graph.node] == ["MatMulInteger"]
    # Not onnxruntime: its MatMulInteger over K = 0 returns uninitialized memory.
    (y,) = run_reference(saved, {"x": np.zeros((2, 0), np.uint8)})
    np.testing.assert_array_equal(y, np.zeros((2, 3), np.int32))
