"""What a `knopt.Session` on device "cuda" uses: one runtime per program, one plan per size.

A program (symbolic or not) is narrowed to the session's precision once. Each set of sizes
binds it (`knopt.ir.bind_program`) and plans it (milliseconds); the plan's launches run as
size-generic kernels of the program's `Runtime`, so a new size compiles nothing unless its
kernels take a shape no size did before (another vector width, an axis of size 1). The
executables of the SIZES_KEPT sizes used last are kept.

Before compiling kernels for structures it has not seen, the runner plans a *probe*: the same
program at other sizes of the same kind, so that the literals that depend on sizes are known
to vary and become parameters from the start (`knopt.cuda.generic`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from knopt.cuda.driver import Gpu
from knopt.cuda.executor import Executable, Runtime
from knopt.cuda.planner import Plan, align, build_plan
from knopt.cuda.precision import effective_precision, narrow_dtype, narrow_program
from knopt.cuda.replay import kernel_classes
from knopt.cuda.resident import ResidentPlan, ResidentSlot
from knopt.cuda.steps import kernel_launches
from knopt.errors import InputError, KnoptError
from knopt.ir.bind import ProgramBinder
from knopt.ir.dims import SizeProfile
from knopt.ir.graph import Graph
from knopt.ir.kvcache import CacheLayout, CacheStep, cache_shape
from knopt.ir.program import Program, program_from_graph
from knopt.ir.shape import Sym

SIZES_KEPT = 32  # plans (with their CUDA graphs) kept per program
PROGRAMS_KEPT = 8  # programs kept (a session that imports per size has one per size)
PROBE_STEP = 8  # probes move sizes by multiples of 8, which keeps vector widths alike
PROBES = 2  # probes observed for new kernel shapes (a size that cannot move in one may in another)


class ProgramState:
    """A program narrowed to the session's precision, its runtime and its plans by size."""

    def __init__(
        self, program: Program, precision: str, gpu: Gpu, stats: Any, lift: bool = True
    ) -> None:
        precision = effective_precision(program, precision)
        target = narrow_dtype(precision)
        self.stats = stats
        self.program = narrow_program(program, target) if target is not None else program
        self.binder = ProgramBinder(self.program)
        self.classes = kernel_classes(self.program)  # the same for every binding
        self.precision = precision
        self.runtime = Runtime(gpu, lift)
        self.executables: OrderedDict[Any, Executable] = OrderedDict()
        self.prepared: set[Any] = set()
        self.caches: DeviceCaches | None = None
        self.plans = 0
        self.warmed = False
        self._last: tuple[Mapping[str, int], ResidentPlan | None, Executable] | None = None

    def plan(self, sizes: Mapping[str, int], resident: ResidentPlan | None) -> Plan:
        """The program planned at `sizes`."""
        self.plans += 1
        bound = self.binder.bind(sizes) if sizes else self.program
        return build_plan(bound, self.precision, resident, self.classes)

    def executable(
        self,
        sizes: Mapping[str, int],
        resident: ResidentPlan | None,
        dims: SizeProfile,
        layout: CacheLayout | None,
    ) -> Executable:
        """The executable at `sizes` (planned, probed and compiled on first use).

        The one returned last is found again without a lookup when asked with the same
        objects, as every decoding step of a bucket asks (`knopt.ir.kvcache.CacheSteps`).
        """
        last = self._last
        if last is not None and last[0] is sizes and last[1] is resident:
            return last[2]
        key = (tuple(sorted(sizes.items())), resident)
        found = self.executables.get(key)
        if found is not None:
            self.executables.move_to_end(key)
            self._last = (sizes, resident, found)
            return found
        plan = self.plan(sizes, resident)
        library = self.runtime.library
        launches = [x for s in plan.steps for x in kernel_launches(s)]
        if not all(library.is_known(x) for x in launches):
            self._probe(plan, sizes, resident, dims, layout)
        found = self.executables[key] = Executable(plan, runtime=self.runtime)
        self.stats.bindings += 1
        while len(self.executables) > SIZES_KEPT:
            _, old = self.executables.popitem(last=False)
            old.close()
        self._last = (sizes, resident, found)
        return found

    def forget_executables(self) -> None:
        """Close every executable (the resident region they address has moved)."""
        for old in self.executables.values():
            old.close()
        self.executables.clear()
        self.prepared.clear()
        self._last = None

    def warm(
        self,
        sizes: list[dict[str, int]],
        resident: ResidentPlan | None,
        dims: SizeProfile,
        layout: CacheLayout | None,
    ) -> None:
        """Make and compile the kernels of plans at `sizes` (skipping any that cannot plan).

        Every plan (and probe) is observed before any template is made, so each template
        lifts every literal seen to vary. Sizes prepared before (or already run) are skipped:
        a prefill warms the decoding steps after it, and a second prompt must not plan again.
        """
        library = self.runtime.library
        plans = []
        for each in sizes:
            each_resident = resident
            if resident is not None and layout is not None:
                each_resident = _moved(resident, each[layout.past], each[layout.new])
            key = (tuple(sorted(each.items())), each_resident)
            if key in self.prepared or key in self.executables:
                continue
            self.prepared.add(key)
            try:
                plan = self.plan(each, each_resident)
            except KnoptError:
                continue
            launches = [x for s in plan.steps for x in kernel_launches(s)]
            if not all(library.is_known(x) for x in launches):
                self._probe(plan, each, each_resident, dims, layout)
            for launch in launches:
                library.observe(launch)
            plans.append(plan)
        for plan in plans:
            self.runtime.templates(plan)
        self.runtime.compile_new()

    def _probe(
        self,
        plan: Plan,
        sizes: Mapping[str, int],
        resident: ResidentPlan | None,
        dims: SizeProfile,
        layout: CacheLayout | None,
    ) -> None:
        """Observe the program at other sizes of the same kind, so varying literals are known.

        A probe that fails to plan (sizes that the model cannot take together) or that
        changes a kernel's structure is no use and is skipped; a probe is only ever observed,
        so it cannot make a kernel wrong, only more or less general.
        """
        library = self.runtime.library
        wanted = {library.tokenized(x).structure for s in plan.steps for x in kernel_launches(s)}
        useful = 0
        for probe in probe_sizes(sizes, dims):
            probe_resident = resident
            if resident is not None and layout is not None:
                probe_resident = _moved(resident, probe[layout.past], probe[layout.new])
            try:
                other = self.plan(probe, probe_resident)
            except KnoptError:
                continue
            launches = [x for s in other.steps for x in kernel_launches(s)]
            if {library.tokenized(x).structure for x in launches} != wanted:
                continue
            for launch in launches:
                library.observe(launch)
            useful += 1
            if useful == PROBES:
                return


def probe_sizes(sizes: Mapping[str, int], dims: SizeProfile) -> Iterator[dict[str, int]]:
    """Other sizes of the same kind as `sizes`, to try in order.

    Sizes 0 and 1 stay (kernels drop axes of size 1); the others move up or down together,
    by multiples of PROBE_STEP first (which keep vector widths), within the profile's ranges:
    a model's sizes are often tied by sums (`total = past + seq`), which a common shift keeps
    when the sizes in the sum that move are one.
    """
    seen = [dict(sizes)]
    for shift in (PROBE_STEP, -PROBE_STEP, 2 * PROBE_STEP, -2 * PROBE_STEP, 4, -4, 2, -2):
        probe = {}
        for name, size in sizes.items():
            moved = size if size <= 1 else size + shift
            allowed = dims.ranges.get(name)
            if (moved < 2 and size > 1) or (allowed is not None and not allowed.contains(moved)):
                moved = size
            probe[name] = moved
        if probe not in seen:
            seen.append(probe)
            yield probe


def warm_sizes(sizes: Mapping[str, int], dims: SizeProfile) -> list[dict[str, int]]:
    """Sizes whose kernels to prepare before the first run: the kinds the profile allows.

    Kernels change shape where a size is 1 (an axis dropped), with its last bits (vector
    widths of 1 to 8 elements) and at powers of two (threads per row). So every combination
    of 1, opt, opt + 1, opt + 2 and opt + 4 of the ranged sizes, then each ranged size at
    the powers of two of its range and its extremes with the others at opt. Sizes the profile
    does not range keep their values from `sizes`.
    """
    base = {n: dims.ranges[n].opt if n in dims.ranges else v for n, v in sizes.items()}
    ranged = [n for n in sizes if n in dims.ranges]
    found = [base]
    combos: list[dict[str, int]] = [{}]
    for name in ranged:
        allowed, opt = dims.ranges[name], dims.ranges[name].opt
        values = [v for v in (opt, 1, opt + 1, opt + 2, opt + 4) if allowed.contains(v)]
        combos = [{**c, name: v} for c in combos for v in dict.fromkeys(values)]
    for name in ranged:
        allowed = dims.ranges[name]
        powers = [2**k for k in range(allowed.max.bit_length()) if allowed.contains(2**k)]
        combos += [{name: v} for v in (*powers, allowed.min, allowed.max)]
    for combo in combos:
        candidate = {**base, **combo}
        if candidate not in found:
            found.append(candidate)
    return found


def _moved(resident: ResidentPlan, planned: int, added: int) -> ResidentPlan:
    return ResidentPlan(
        resident.slots,
        planned,
        added,
        resident.relocate,
        resident.pos_offset,
        resident.region_bytes,
    )


class DeviceCaches:
    """Resident caches on the GPU: one buffer each in the runtime's resident region.

    A static cache (`layout.mask`) holds `layout.rows` positions; others grow (by doubling,
    through the host) as the cached length needs. The buffers are zeroed when made, so rows
    that are read but masked are finite.
    """

    def __init__(self, layout: CacheLayout, graph: Graph, program: Program) -> None:
        self.layout = layout
        self.graph = graph
        ids = dict(zip(program.input_names, program.inputs, strict=True))
        outs = dict(zip(program.output_names, program.outputs, strict=True))
        self.ids = {s.input: (ids[s.input], outs[s.output]) for s in layout.slots}
        self.length = 0
        self.rows = 0
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.slots: tuple[ResidentSlot, ...] = ()
        self.pos_offset = 0
        self.region_bytes = 0
        self._sizes_seen: tuple[tuple[str, int], ...] = ()
        self._last_sizes: Mapping[str, int] | None = None  # the last sizes found to fit
        self._plans: dict[tuple[int, int], ResidentPlan] = {}

    def reserve(self, runtime: Runtime, sizes: Mapping[str, int], need: int) -> bool:
        """Make room for `need` rows at `sizes`; True if the buffers were made anew.

        Raises:
            InputError: If the caches hold positions for other sizes (another batch).
        """
        if sizes is self._last_sizes and need <= self.rows:
            return False  # every decoding step of a bucket asks with the same sizes
        key = tuple(sorted(sizes.items()))
        if key == self._sizes_seen and need <= self.rows:
            self._last_sizes = sizes
            return False
        shapes = {s.input: tuple(cache_shape(self.graph, s, sizes, 1)) for s in self.layout.slots}
        rows = self.layout.rows or max(need, 2 * self.rows, 16)
        if shapes == self.shapes and need <= self.rows:
            self._sizes_seen, self._last_sizes = key, sizes
            return False
        if self.length and shapes != self.shapes:
            raise InputError(
                "the resident caches hold positions of other sizes "
                f"({self.shapes} against {shapes}); call Session.reset() to start anew"
            )
        kept = self.download(runtime) if self.length else {}
        self.shapes, self.rows = shapes, rows
        offset, slots = 0, []
        for slot in self.layout.slots:
            dtype = self.graph.inputs[self.graph.input_names.index(slot.input)].dtype
            shape = list(shapes[slot.input])
            shape[slot.axis] = rows
            source, present = self.ids[slot.input]
            slots.append(ResidentSlot(source, present, slot.axis, offset, tuple(shape)))
            offset += align(int(np.prod(shape)) * dtype.itemsize)
        self.slots, self.pos_offset = tuple(slots), offset
        self.region_bytes = offset + align(4)
        self._plans = {}
        self._sizes_seen, self._last_sizes = (), None
        if runtime.resident:
            runtime.gpu.release(runtime.resident)
        runtime.resident = runtime.gpu.allocate(self.region_bytes)
        runtime.resident_generation += 1
        runtime.gpu.fill(runtime.resident, 0, self.region_bytes)
        for name, array in kept.items():
            self.upload(runtime, name, array)
        return True

    def plan(self, step: CacheStep) -> ResidentPlan:
        """The resident plan of a run (the same object for every run of a bucket)."""
        key = (step.planned, step.added)
        found = self._plans.get(key)
        if found is None:
            found = self._plans[key] = ResidentPlan(
                self.slots,
                step.planned,
                step.added,
                self.layout.mask is not None,
                self.pos_offset,
                self.region_bytes,
            )
        return found

    def upload(self, runtime: Runtime, name: str, rows: np.ndarray) -> None:
        """Write a cache's first rows from a host array (its real positions)."""
        (slot,) = [s for s in self.layout.slots if s.input == name]
        placed = self._placed(name)
        full = np.zeros(placed.shape, rows.dtype)
        index = [slice(None)] * rows.ndim
        index[slot.axis] = slice(0, rows.shape[slot.axis])
        full[tuple(index)] = rows
        runtime.gpu.upload(runtime.resident + placed.offset, full)

    def download(self, runtime: Runtime, name: str | None = None) -> dict[str, np.ndarray]:
        """The real rows of the caches (or of cache `name`), by input name."""
        found = {}
        for slot in self.layout.slots:
            if name is not None and slot.input != name:
                continue
            placed = self._placed(slot.input)
            dtype = self.graph.inputs[self.graph.input_names.index(slot.input)].dtype.numpy
            full = runtime.gpu.download(
                runtime.resident + placed.offset, np.empty(placed.shape, dtype)
            )
            index = [slice(None)] * full.ndim
            index[slot.axis] = slice(0, self.length)
            found[slot.input] = np.ascontiguousarray(full[tuple(index)])
        return found

    def _placed(self, name: str) -> ResidentSlot:
        source, _ = self.ids[name]
        return next(s for s in self.slots if s.input == source)


class CudaRunner:
    """Runs graphs or Programs on the GPU, each optimized program prepared once for all sizes.

    Args:
        precision: "f32", "tf32", "fp16" or "bf16".
        lift: Size-generic kernels; False compiles kernels for each size with every literal
            a constant (a baseline for benchmarks).

    Attributes:
        dims: The session's size ranges (probes stay inside them).
        stats: Counts `bindings`, the sizes planned for a run (the session's stats).

    Raises:
        KnoptError: If `precision` is unknown.
    """

    def __init__(self, precision: str = "f32", lift: bool = True) -> None:
        narrow_dtype(precision)
        self.precision = precision
        self.lift = lift
        self.dims = SizeProfile({})
        self.stats: Any = _Count()
        self._gpu: Gpu | None = None
        self._states: OrderedDict[Graph | Program, ProgramState] = OrderedDict()

    @property
    def gpu(self) -> Gpu:
        """The GPU every program runs on (made on first use)."""
        if self._gpu is None:
            self._gpu = Gpu()
        return self._gpu

    def state(self, source: Graph | Program) -> ProgramState:
        """The prepared state of a program (or of a graph's one-op-per-kernel program)."""
        last = next(reversed(self._states.items()), None)
        if last is not None and last[0] is source:
            return last[1]  # the one used last, as a session's runs ask
        found = self._states.get(source)
        if found is None:
            program = source if isinstance(source, Program) else program_from_graph(source)
            found = self._states[source] = ProgramState(
                program, self.precision, self.gpu, self.stats, self.lift
            )
            while len(self._states) > PROGRAMS_KEPT:
                _, old = self._states.popitem(last=False)
                for executable in old.executables.values():
                    executable.close()
                old.runtime.close()
        else:
            self._states.move_to_end(source)
        return found

    def wait_for_plans(self, timeout: float | None = None) -> bool:
        """Wait for the library plans built in the background (`Runtime.wait_for_plans`).

        Returns:
            Whether none is still on its way.
        """
        return all([state.runtime.wait_for_plans(timeout) for state in list(self._states.values())])

    def executable(
        self, source: Graph | Program, sizes: Mapping[str, int] | None = None
    ) -> Executable:
        """The executable of `source` at `sizes` (none for a program without symbols)."""
        return self.state(source).executable(sizes or {}, None, self.dims, None)

    def run(
        self,
        source: Graph | Program,
        sizes: Mapping[str, int],
        feeds: Mapping[str, Any],
        device_outputs: bool = False,
        step: CacheStep | None = None,
    ) -> list[Any]:
        """The outputs of `source` at `sizes` on `feeds`, in order.

        With `step`, the run appends to the resident caches (`load_caches` set them up): their
        inputs are not fed and their outputs come back as None (see `cache_output`).
        """
        state = self.state(source)
        caches = state.caches
        if step is None or caches is None:
            if sizes and self.dims.ranges and not state.warmed:
                state.warmed = True
                state.warm(warm_sizes(sizes, self.dims), None, self.dims, None)
            executable = state.executable(sizes, None, self.dims, None)
            return executable.run(feeds, device_outputs=device_outputs)
        need = max(step.planned, step.length) + step.added
        if caches.reserve(state.runtime, step.sizes, need):
            state.forget_executables()
        executable = state.executable(sizes, caches.plan(step), self.dims, caches.layout)
        if caches.layout.mask is not None:
            state.runtime.gpu.upload(
                state.runtime.resident + caches.pos_offset, np.array([step.length], np.int32)
            )
        results = iter(executable.run(feeds, device_outputs=device_outputs))
        caches.length = step.length + step.added
        kept = caches.layout.outputs
        return [None if name in kept else next(results) for name in state.program.output_names]

    # ---- resident caches -------------------------------------------------------------------

    def warm_steps(self, source: Graph | Program, steps: list[CacheStep]) -> None:
        """Prepare the kernels of later runs of the caches (decoding after a prefill)."""
        state = self.state(source)
        caches = state.caches
        assert caches is not None
        for step in steps:
            state.warm([dict(step.sizes)], caches.plan(step), self.dims, caches.layout)

    def load_caches(
        self, source: Graph | Program, layout: CacheLayout, graph: Graph, feeds: Mapping[str, Any]
    ) -> int:
        """Set up the resident caches of `source`; returns the cached length.

        Resident inputs given in `feeds` (numpy arrays, all of them or none) replace the
        caches.

        Raises:
            InputError: If only some resident inputs are given or they disagree on the length.
        """
        state = self.state(source)
        if state.caches is None:
            state.caches = DeviceCaches(layout, graph, state.program)
        caches = state.caches
        if layout.inputs.isdisjoint(feeds):
            return caches.length  # every step but a restart from given caches
        given = {s.input: np.asarray(feeds[s.input]) for s in layout.slots if s.input in feeds}
        if len(given) != len(layout.slots):
            raise InputError(
                f"give every resident input or none; missing {sorted(layout.inputs - set(given))}"
            )
        lengths = {given[s.input].shape[s.axis] for s in layout.slots}
        if len(lengths) != 1:
            raise InputError(f"resident inputs disagree on the cached length ({sorted(lengths)})")
        length = lengths.pop()
        first = layout.slots[0]
        value = graph.inputs[graph.input_names.index(first.input)]
        sizes = {}
        for dim, size in zip(value.shape, given[first.input].shape, strict=True):
            symbol = dim.as_symbol() if isinstance(dim, Sym) else None
            if symbol is not None:
                sizes[symbol] = int(size)
        caches.length = 0
        caches.reserve(state.runtime, sizes, length + 1)
        for name, array in given.items():
            caches.upload(state.runtime, name, array)
        caches.length = length
        return length

    def cache_output(self, source: Graph | Program, name: str) -> np.ndarray:
        """A resident output as the model computes it: the real rows of its cache."""
        state = self.state(source)
        assert state.caches is not None
        (slot,) = [s for s in state.caches.layout.slots if s.output == name]
        return state.caches.download(state.runtime, slot.input)[slot.input]

    def reset_caches(self) -> None:
        """Empty every program's resident caches."""
        for state in self._states.values():
            if state.caches is not None:
                state.caches.length = 0


class _Count:
    """Plans made, when no session counts them."""

    bindings = 0
