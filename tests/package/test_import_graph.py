"""``lightning_mqgnn`` has no import cycle, its loaders do not depend on Lightning, and importing
the package or its strategy loads none of the numba kernels.

Every import statement counts, at module level and inside functions alike (a function-level
import only delays a cycle to the first call; it does not remove the dependency), as do imports
under ``if TYPE_CHECKING:``. An import names one module: ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg``. The parent packages Python initialises on
the way are not edges (a package's ``__init__`` re-exporting its own modules is not a cycle).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from helpers.paths import REPO

PACKAGE = "lightning_mqgnn"
ROOT = REPO / PACKAGE


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(edges inside the package, external top-level packages) of every module."""
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    external: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = resolve(name, is_package, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                if target == PACKAGE or target.startswith(PACKAGE + "."):
                    while target not in mods:  # `import pkg.mod.attr` style: the module it names
                        target = target.rsplit(".", 1)[0]
                    if target != name:
                        edges[name].add(target)
                else:
                    external[name].add(target.split(".")[0])
    return edges, external


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for n in edges[todo.pop()]:
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def test_the_walker_resolves_imports_and_finds_cycles():
    edges, _ = import_graph()
    assert f"{PACKAGE}.pipeline.loader" in edges[f"{PACKAGE}.data"]  # from-import of a module
    assert f"{PACKAGE}.sampling.batch" in edges[f"{PACKAGE}.sampling.gns"]  # of a name in a module
    relative = ast.parse("from ..sampling import batch").body[0]
    assert resolve(f"{PACKAGE}.pipeline.loader", False, relative) == f"{PACKAGE}.sampling"
    assert (
        resolve(f"{PACKAGE}.pipeline", True, ast.parse("from . import plan").body[0]) == f"{PACKAGE}.pipeline"
    )
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_the_package():
    edges, _ = import_graph()
    assert len(edges) > 40
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_loaders_do_not_depend_on_lightning_or_the_datamodule():
    edges, external = import_graph()
    for loader in (f"{PACKAGE}.pipeline.loader", f"{PACKAGE}.pipeline.sequential"):
        # the package __init__s on the way re-export more than the loader uses: only modules count
        mods = modules()
        used = {m for m in reachable(edges, loader) if mods[m].name != "__init__.py"}
        assert f"{PACKAGE}.data" not in used
        lightning_users = sorted(m for m in used if "lightning" in external[m])
        assert lightning_users == [], f"{loader} reaches Lightning through {lightning_users}"


# modules that import numba and compile or load kernels when imported
KERNEL_MODULES = (
    f"{PACKAGE}.sampling.cpu_kernels",
    f"{PACKAGE}.models.dropout",
    f"{PACKAGE}.models.omp_blocks",
    f"{PACKAGE}.models.activated_aggregation",
)


def loaded_after(code: str) -> list[str]:
    """numba's and the kernel modules that ``code`` leaves imported in a fresh interpreter."""
    report = "import sys; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] == 'numba' or m in KERNELS)))"
    script = f"KERNELS = {KERNEL_MODULES!r}\n{code}\n{report}"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()


def test_kernel_modules_are_those_that_import_numba():
    _, external = import_graph()
    assert sorted(m for m, packages in external.items() if "numba" in packages) == sorted(KERNEL_MODULES)


def test_importing_the_strategy_or_the_package_loads_no_kernels():
    """numba and its compiled kernels load with the first sampler or model, not with the strategy
    (a second of a strategy user's start-up)."""
    for code in ("import lightning_mqgnn.strategy", "import lightning_mqgnn"):
        assert loaded_after(code) == [], code


def test_a_cpu_transpose_loads_its_kernel_at_first_use():
    """``aggregate.transpose_of`` imports its kernel when first called on the CPU, and gives the
    order of the sort it replaces."""
    code = """
import torch
from lightning_mqgnn.sampling.aggregate import transpose_of
indptr, indices = torch.tensor([0, 2, 3, 5]), torch.tensor([1, 0, 1, 2, 1])
weights = torch.arange(5, dtype=torch.float32)
kernel = transpose_of(indptr, indices, weights, 3)
sorted_ = transpose_of(indptr, indices, weights.double(), 3)  # float64: the torch path
assert all(torch.equal(a, b.to(a.dtype)) for a, b in zip(kernel, sorted_)), (kernel, sorted_)
"""
    assert f"{PACKAGE}.sampling.cpu_kernels" in loaded_after(code)


def first_importer(module: str, code: str) -> str:
    """The file, outside torch, whose import first loaded ``module`` while ``code`` ran in a fresh
    interpreter ('' when nothing loaded it)."""
    script = f"""
import importlib.abc, sys, traceback
from pathlib import Path
import torch
TORCH = Path(torch.__file__).parent
found = []
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {module!r} and not found:
            files = [f.filename for f in traceback.extract_stack()[:-1]]
            found.append([f for f in files if not f.startswith("<") and TORCH not in Path(f).parents][-1])
sys.meta_path.insert(0, Spy())
{code}
print(found[0] if found else "")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_torch_dynamo_is_loaded_by_lightning_not_by_the_package():
    """``torch._dynamo`` brings sympy, over a second of import: the package leaves loading it to a
    compilation (Lightning's own import loads it too, which the package cannot spare)."""
    for code in ("import lightning_mqgnn.strategy", "import lightning_mqgnn"):
        importer = first_importer("torch._dynamo", code)
        assert ROOT not in Path(importer).parents, (code, importer)


def test_a_device_sampler_process_loads_no_torch_dynamo():
    """A device sampler process imports neither Lightning nor ``torch._dynamo`` (nor sympy), also
    after building a block's transpose, whose function torch.compile runs eagerly."""
    code = """
import multiprocessing, sys
multiprocessing.current_process().name = "mqgnn-device-sampler"
import torch
import lightning_mqgnn.pipeline.sampler_process
from lightning_mqgnn import SAMPLER_PROCESS_NAME
from lightning_mqgnn.sampling.aggregate import transpose_of
assert multiprocessing.current_process().name == SAMPLER_PROCESS_NAME
transpose_of(torch.tensor([0, 2, 3]), torch.tensor([1, 0, 1]), torch.ones(3), 2)
print(sorted(m for m in ("torch._dynamo", "sympy", "lightning") if m in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"
