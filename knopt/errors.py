"""The errors knopt raises. Every one derives from `KnoptError`.

Each message names the culprit (a node, a file, a rule, a CUDA call) and says what to do.
"""

from __future__ import annotations


class KnoptError(Exception):
    """Base class of every error knopt raises on purpose."""


class InvalidModelError(KnoptError):
    """A model file is not a readable ONNX model (truncated, not protobuf, unsafe paths)."""


class UnsupportedModelError(KnoptError):
    """The model uses an op, attribute, dtype or shape that knopt does not support."""


class UnsupportedOpError(UnsupportedModelError):
    """A device cannot run an op knopt keeps as it is (an opaque op: a node of an op it lacks).

    `knopt optimize` (`--target onnx`) writes such nodes back unchanged, for a runtime that
    has the op.

    Attributes:
        op_type: The ONNX op type.
        domain: Its domain ('' for the default one).
        node: The ONNX node's name.
    """

    def __init__(self, message: str, op_type: str, domain: str, node: str) -> None:
        super().__init__(message)
        self.op_type = op_type
        self.domain = domain
        self.node = node


class InvalidGraphError(KnoptError):
    """An IR graph breaks an invariant: a cycle, a dangling value, a shape that cannot be."""


class SymbolicSizeError(UnsupportedModelError):
    """A step needs a static size where the model has a symbolic one (a dynamic axis).

    Loading with the sizes fixed (`dims=`) avoids it; `knopt.compile` does that by itself,
    importing such a model once per set of input sizes.

    Attributes:
        same: Pairs of symbol names any of which, were its two sizes one, would avoid it.
    """

    def __init__(self, message: str, same: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.same = same


class SymbolicBroadcastError(SymbolicSizeError, InvalidGraphError):
    """Different symbolic sizes meet where they must be equal (or 1), and nothing says they are."""


class UsageError(KnoptError):
    """A command line asks for something that cannot be (the CLI exits with status 2).

    A malformed option value, an output path that cannot be written, sizes the model does not
    name.
    """


class InputError(KnoptError):
    """The inputs given to a session do not match the model (names, shapes, dtypes)."""


class ResultError(KnoptError, BufferError):
    """A result left on the GPU (`device_outputs`) cannot be handed over as asked.

    A later run has overwritten it, or a DLPack consumer asked for what knopt does not do
    (another device, a copy, the ambiguous stream 0). It is a `BufferError`, which the DLPack
    protocol expects of a producer that refuses.
    """


class MemoryLimitError(KnoptError):
    """A tensor would exceed the memory budget (`knopt.set_memory_limit`, `KNOPT_MEMORY_LIMIT`).

    Raised before anything is allocated, naming the node or file that asked for it.
    """


class RunError(KnoptError):
    """Running a model failed on the values it computed (an index out of range); names the node."""


class RuleFileError(KnoptError):
    """A rule file failed to parse or type-check, or a rule misbehaved at run time."""


class OptimizeError(KnoptError):
    """The optimizer produced something it cannot use (a knopt bug or an unsound rule)."""


class CodegenError(KnoptError):
    """A kernel template or plan that knopt produced is wrong. Always a knopt bug."""


class CudaError(KnoptError):
    """A CUDA, NVRTC, cuBLASLt or cuDNN call failed.

    Attributes:
        call: The name of the failing call.
        status: The status code or name the library returned, if any.
        log: Extra diagnostic text (an NVRTC compile log, for instance).
    """

    def __init__(self, call: str, status: object = None, log: str = "") -> None:
        self.call = call
        self.status = status
        self.log = log
        message = f"{call} failed"
        if status is not None:
            message += f" with status {status}"
        if log:
            message += f"\n{log}"
        super().__init__(message)
