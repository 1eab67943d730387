"""The compiled vLLM artifact's manifest, its comparison with a start, and how a start uses it (no vLLM
needed: the facts a start collects are given here; tests/integration/test_vllm_compile.py runs vLLM)."""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmforge.config import ServingConfig
from lmforge.deploy.compile_match import compile_here_problem
from lmforge.engines.vllm import compile_cache
from lmforge.engines.vllm.compile_cache import (
    AOT_DIR,
    CompileCacheError,
    StartFacts,
    compiled_folder,
    decide,
    prepare,
    write_compiled,
)
from lmforge.engines.vllm.compile_manifest import (
    Decision,
    Difference,
    Manifest,
    Target,
    check_files,
    compare,
    compiled_settings,
    cpu_flags,
    scan_files,
)

CPU = Target(
    vllm="0.32.0",
    torch="2.13.0+cpu",
    python="3.11.7",
    arch="x86_64",
    device="cpu",
    cpu_flags=("avx2", "avx512f", "avx512_bf16"),
)
SETTINGS = {"dtype": "float32", "max_model_len": 1024, "max_num_seqs": 32, "tensor_parallel_size": 1}
KEY = "939104e9f63110566f6eda85e93bb3aec99404bbea9b49dfe1d484f500b34c1b"


def facts(**changes: object) -> StartFacts:
    base = StartFacts(settings=dict(SETTINGS), target=CPU, env={}, model="ab" * 32)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def manifest(**changes: object) -> Manifest:
    base = Manifest(settings=dict(SETTINGS), target=CPU, env={}, model="ab" * 32)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def differences(m: Manifest, f: StartFacts) -> list[str]:
    return [str(d) for d in compare(m, settings=f.settings, target=f.target, env=f.env, model=f.model)]


def test_the_same_start_is_a_hit_and_a_changed_field_is_named() -> None:
    assert differences(manifest(), facts()) == []
    changed = facts(settings={**SETTINGS, "max_model_len": 512})
    assert differences(manifest(), changed) == ["max_model_len: 1024 != 512"]


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (dataclasses.replace(CPU, vllm="0.33.0"), "vllm: 0.32.0 != 0.33.0"),
        (dataclasses.replace(CPU, torch="2.14.0+cpu"), "torch: 2.13.0+cpu != 2.14.0+cpu"),
        (dataclasses.replace(CPU, python="3.11.2"), "python: 3.11.7 != 3.11.2"),
        (
            dataclasses.replace(CPU, cpu_flags=("avx2", "avx512f")),
            "cpu_flags: avx512_bf16 != not on this CPU",
        ),
        (dataclasses.replace(CPU, device="cuda", gpu="NVIDIA A10G", cuda="12.8"), "device: cpu != cuda"),
    ],
)
def test_another_machine_or_installation_is_a_miss(target: Target, expected: str) -> None:
    assert expected in differences(manifest(), facts(target=target))


def test_a_cpu_with_more_extensions_runs_what_a_smaller_one_compiled() -> None:
    bigger = dataclasses.replace(CPU, cpu_flags=(*CPU.cpu_flags, "amx_tile", "amx_bf16"))
    assert differences(manifest(), facts(target=bigger)) == []


def test_environment_model_and_new_settings_are_compared() -> None:
    assert differences(manifest(), facts(env={"VLLM_CPU_OMP_THREADS_BIND": "0-1"})) == [
        "VLLM_CPU_OMP_THREADS_BIND: unset != 0-1"
    ]
    assert differences(manifest(), facts(model="cd" * 32)) == [
        "model config.json: sha256:abababababab != sha256:cdcdcdcdcdcd"
    ]
    assert differences(manifest(), facts(settings={**SETTINGS, "quantization": "fp8"})) == [
        "quantization: unset != fp8"
    ]


def test_settings_leave_out_what_does_not_shape_the_graph() -> None:
    @dataclasses.dataclass
    class Structured:
        backend: str = "xgrammar"

    kwargs = {
        "model": "/somewhere",
        "tokenizer": "/somewhere",
        "kv_cache_memory_bytes": 2**25,
        "seed": 0,
        "dtype": "float32",
        "structured_outputs_config": Structured(),
        "hf_overrides": {"rope_scaling": {"factor": 2.0}},
    }
    assert compiled_settings(kwargs) == {
        "dtype": "float32",
        "hf_overrides": {"rope_scaling": {"factor": 2.0}},
        "structured_outputs_config": {"backend": "xgrammar"},
    }


def test_manifest_round_trip_and_unreadable_ones() -> None:
    m = manifest(vllm_cache_keys=(KEY,), probe={"prompt": "x", "greedy_ids": [1, 2]}, compile_seconds=12.5)
    assert Manifest.from_json(m.to_json()) == m
    for text, detail in [
        ("[]", "not a JSON object"),
        ('{"format": 2}', "format 2"),
        ('{"format": 1, "backend": "trtllm"}', "backend 'trtllm'"),
        ('{"format": 1, "backend": "vllm"}', "missing or malformed field"),
    ]:
        with pytest.raises(ValueError, match=detail):
            Manifest.from_json(text)


def test_cpu_flags_from_cpuinfo() -> None:
    info = "processor : 0\nflags : fpu sse4_2 avx avx2 fma avx512f avx512_bf16 amx_tile\nbugs : x\n"
    assert cpu_flags(info) == ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")
    assert cpu_flags("Features : fp asimd sve\n") == ("asimd", "sve")


def _artifact(root: Path) -> Path:
    """A VLLM_CACHE_ROOT as vLLM leaves it after a compile (file names as vLLM 0.32 writes them)."""
    graph = root / AOT_DIR / KEY / "rank_0_0" / "model"
    graph.parent.mkdir(parents=True)
    graph.write_bytes(b"graph" * 1000)
    kernel = root / AOT_DIR / KEY / "inductor_cache" / "sg" / "kernel.main.so"
    kernel.parent.mkdir(parents=True)
    kernel.write_bytes(b"\x7fELF" + b"k" * 100)
    (root / AOT_DIR / KEY / "rank_0_0" / "model.lock").write_text("")  # transient: not kept
    (root / "modelinfos").mkdir()
    (root / "modelinfos" / "llama.json").write_text("{}")
    return graph


def test_file_check_names_missing_truncated_and_corrupted_files(tmp_path: Path) -> None:
    graph = _artifact(tmp_path)
    files = scan_files(tmp_path)
    assert check_files(tmp_path, files) is None
    rel = graph.relative_to(tmp_path).as_posix()
    graph.write_bytes(b"graph" * 999)
    assert check_files(tmp_path, files) == f"{rel} has 4,995 bytes, the manifest says 5,000 (truncated?)"
    graph.write_bytes(b"GRAPH" * 1000)
    assert check_files(tmp_path, files) == f"{rel} does not match its sha256 in the manifest (corrupted?)"
    graph.unlink()
    assert check_files(tmp_path, files) == f"{rel} is missing"
    assert check_files(tmp_path, ()) == "the manifest lists no compiled files"


def _compiled_model(tmp_path: Path, f: StartFacts) -> Path:
    """A model folder with a compiled artifact written the way lmforge compile writes it."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    capture = tmp_path / "capture"
    _artifact(capture)
    state = compile_cache.CompileCache(Decision("none"), f, "auto", capture_root=capture)
    write_compiled(model, state, compile_seconds=3.0, created_by="test", probe={"greedy_ids": [5]})
    return model


def test_decide_none_hit_miss_and_damage(tmp_path: Path) -> None:
    assert decide(tmp_path, "auto", facts).line() == (
        "compile cache: none (no lmforge-compiled/vllm in the model folder)"
    )
    model = _compiled_model(tmp_path, facts())
    written = Manifest.from_json((compiled_folder(model) / "manifest.json").read_text())
    assert written.vllm_cache_keys == (KEY,) and written.probe == {"greedy_ids": [5]}
    assert not any(f.path.endswith(".lock") for f in written.files)
    assert decide(model, "auto", facts).line() == "compile cache: hit"
    assert decide(model, "off", facts).line() == "compile cache: none (option.compile_cache=off)"
    changed = decide(model, "auto", lambda: facts(settings={**SETTINGS, "max_model_len": 512}))
    assert changed.line() == "compile cache: miss (max_model_len: 1024 != 512)"
    graph = compiled_folder(model) / "cache" / AOT_DIR / KEY / "rank_0_0" / "model"
    graph.write_bytes(graph.read_bytes()[:100])
    assert decide(model, "auto", facts).line() == (
        f"compile cache: miss (compiled folder damaged: {AOT_DIR.as_posix()}/{KEY}/rank_0_0/model has 100 "
        "bytes, the manifest says 5,000 (truncated?))"
    )
    (compiled_folder(model) / "manifest.json").write_text("{not json")
    assert (
        decide(model, "auto", facts)
        .line()
        .startswith("compile cache: miss (lmforge-compiled/vllm/manifest.json is unreadable: ")
    )


@pytest.fixture
def vllm_environ() -> Iterator[dict[str, str]]:
    """prepare() sets vLLM's variables in os.environ: each test gets the environment back as it was."""
    saved = dict(os.environ)
    for name in ("TORCHINDUCTOR_CACHE_DIR", "VLLM_FORCE_AOT_LOAD", "LMFORGE_VLLM_PORTABLE_AOT"):
        os.environ.pop(name, None)
    os.environ["VLLM_CACHE_ROOT"] = "/nonexistent/user-cache"
    try:
        yield os.environ  # type: ignore[misc]
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _read_only(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def test_a_hit_runs_from_a_writable_copy_of_a_read_only_folder(
    tmp_path: Path, vllm_environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _compiled_model(tmp_path, facts())
    _read_only(model)
    monkeypatch.setattr(StartFacts, "collect", classmethod(lambda cls, config, kwargs: facts()))
    state = prepare(ServingConfig(model_dir=model), {})
    try:
        assert state.decision.status == "hit" and state.runtime_root is not None
        root = state.runtime_root
        assert vllm_environ["VLLM_CACHE_ROOT"] == str(root)
        assert vllm_environ["TORCHINDUCTOR_CACHE_DIR"] == str(root / "inductor")
        assert vllm_environ["LMFORGE_VLLM_PORTABLE_AOT"] == "1"
        assert "VLLM_FORCE_AOT_LOAD" not in vllm_environ
        graph = root / AOT_DIR / KEY / "rank_0_0" / "model"
        assert graph.read_bytes() == b"graph" * 1000 and os.access(graph, os.W_OK)
        state.after_start()  # vLLM loaded it: nothing written
        assert state.metrics() == {
            "compile_cache_hit": 1.0,
            "compile_cache_miss": 0.0,
            "compile_cache_none": 0.0,
            "compile_cache_recompiled": 0.0,
        }
        graph.write_bytes(b"recompiled")  # vLLM compiled after all and saved its graph again
        state.after_start()
        assert state.recompiled and state.metrics()["compile_cache_recompiled"] == 1.0
    finally:
        state.cleanup()
    assert not root.exists()


def test_required_refuses_a_miss_naming_the_field_and_auto_compiles_just_in_time(
    tmp_path: Path, vllm_environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _compiled_model(tmp_path, facts())
    shorter = facts(settings={**SETTINGS, "max_model_len": 512})
    monkeypatch.setattr(StartFacts, "collect", classmethod(lambda cls, config, kwargs: shorter))
    with pytest.raises(
        CompileCacheError,
        match=r"required refuses to start: compile cache: miss \(max_model_len: 1024 != 512\)",
    ):
        prepare(ServingConfig(model_dir=model, compile_cache="required"), {})
    state = prepare(ServingConfig(model_dir=model), {})
    assert state.decision.status == "miss" and state.runtime_root is None
    assert vllm_environ["VLLM_CACHE_ROOT"] == "/nonexistent/user-cache"  # vLLM's own cache, untouched
    with pytest.raises(CompileCacheError, match="compile cache: none"):
        prepare(ServingConfig(model_dir=tmp_path / "capture", compile_cache="required"), {})
    monkeypatch.setattr(StartFacts, "collect", classmethod(lambda cls, config, kwargs: facts()))
    hit = prepare(ServingConfig(model_dir=model, compile_cache="required"), {})
    hit.cleanup()
    assert vllm_environ["VLLM_FORCE_AOT_LOAD"] == "1"  # a graph that fails to load fails the start


def test_a_compile_starts_from_the_users_model_inspections_and_gives_back_what_it_learned(
    tmp_path: Path, vllm_environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "user-cache"
    (home / "modelinfos").mkdir(parents=True)
    (home / "modelinfos" / "known.json").write_text('{"hash": "user"}')
    vllm_environ["VLLM_CACHE_ROOT"] = str(home)
    monkeypatch.setattr(StartFacts, "collect", classmethod(lambda cls, config, kwargs: facts()))
    capture = tmp_path / "capture"
    state = prepare(ServingConfig(model_dir=tmp_path / "model"), {}, capture_to=capture)
    assert vllm_environ["VLLM_CACHE_ROOT"] == str(capture)
    assert (capture / "modelinfos" / "known.json").read_text() == '{"hash": "user"}'  # seeded
    # what vLLM writes while it builds its configuration: a new class, and the known one rewritten
    (capture / "modelinfos" / "learned.json").write_text('{"hash": "new"}')
    (capture / "modelinfos" / "known.json").write_text('{"hash": "capture"}')
    state.share_model_infos()
    assert (home / "modelinfos" / "learned.json").read_text() == '{"hash": "new"}'
    assert (home / "modelinfos" / "known.json").read_text() == '{"hash": "user"}'  # left alone
    assert sorted(p.name for p in (home / "modelinfos").iterdir()) == ["known.json", "learned.json"]
    (tmp_path / "a-file").write_text("")
    blocked = dataclasses.replace(state, model_infos_home=tmp_path / "a-file" / "modelinfos")
    blocked.share_model_infos()  # a cache that cannot be written (root ignores modes): skipped
    # a start that is not a compile shares nothing
    plain = compile_cache.CompileCache(Decision("none"), facts(), "auto")
    plain.share_model_infos()


def test_deploy_compiles_only_where_the_instance_can_use_it() -> None:
    ice_lake = dataclasses.replace(CPU, cpu_flags=("avx2", "avx512f", "avx512_vnni"))
    assert compile_here_problem("ml.m6i.xlarge", ice_lake) is None
    # a Sapphire Rapids family (in the instance catalog) takes what an AVX-512 BF16 CPU compiled
    zen4_like = dataclasses.replace(ice_lake, cpu_flags=(*ice_lake.cpu_flags, "avx512_bf16"))
    assert compile_here_problem("ml.m7i.xlarge", zen4_like) is None
    assert "avx512_bf16" in str(compile_here_problem("ml.m6i.xlarge", zen4_like))
    assert compile_here_problem("ml.m5.xlarge", ice_lake) == (
        "this CPU has avx512_vnni, which not every ml.m5.xlarge processor has: kernels compiled here could "
        "fault there"
    )
    assert compile_here_problem("ml.g5.xlarge", ice_lake) == (
        "ml.g5.xlarge has A10G GPUs and this machine does not (it has no GPU)"
    )
    a10g = dataclasses.replace(CPU, device="cuda", gpu="NVIDIA A10G", cuda="12.8", vllm="0.33.0")
    assert compile_here_problem("ml.g5.2xlarge", a10g) is None
    assert "this machine does not (its GPU is NVIDIA A10G)" in str(
        compile_here_problem("ml.p4d.24xlarge", a10g)
    )
    assert compile_here_problem("ml.c5.xlarge", a10g) == (
        "ml.c5.xlarge is a CPU instance type and this machine compiles for its NVIDIA A10G GPU"
    )


def test_difference_shows_unset_and_json() -> None:
    assert str(Difference("hf_overrides", None, {"a": 1})) == 'hf_overrides: unset != {"a": 1}'


def test_the_compiled_folder_travels_in_model_tar_gz(tmp_path: Path) -> None:
    from lmforge.artifacts.package import package_model, safe_extract

    model = _compiled_model(tmp_path, facts())
    (model / "serving.properties").write_text("option.rolling_batch=vllm\n")
    result = package_model(model, tmp_path / "model.tar.gz")
    packed = {f.path for f in result.files}
    assert "lmforge-compiled/vllm/manifest.json" in packed
    assert f"lmforge-compiled/vllm/cache/{AOT_DIR.as_posix()}/{KEY}/rank_0_0/model" in packed
    extracted = tmp_path / "opt-ml-model"
    safe_extract(tmp_path / "model.tar.gz", extracted)
    assert decide(extracted, "auto", facts).line() == "compile cache: hit"


def test_compile_says_lmi_dist_has_nothing_to_compile(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from lmforge.cli import main

    (tmp_path / "serving.properties").write_text("option.rolling_batch=lmi-dist\n")
    result = CliRunner().invoke(main, ["compile", str(tmp_path)])
    assert result.exit_code == 2
    assert "option.rolling_batch=lmi-dist: nothing to compile ahead of time" in result.stderr


def test_compile_output_never_replaces_a_folder_it_did_not_write(tmp_path: Path) -> None:
    import importlib.util

    from click.testing import CliRunner

    from lmforge.cli import main

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs the vllm extra")
    model, other = tmp_path / "model", tmp_path / "other"
    model.mkdir()
    other.mkdir()
    (model / "serving.properties").write_text("option.rolling_batch=vllm\n")
    (other / "keep.txt").write_text("mine")
    result = CliRunner().invoke(main, ["compile", str(model), "--output", str(other)])
    assert result.exit_code == 2 and "holds no compiled model; it would be replaced" in result.output
    assert (other / "keep.txt").read_text() == "mine"


def test_a_start_removes_copies_that_killed_starts_left(tmp_path: Path) -> None:
    from lmforge.engines.vllm.compile_cache import _remove_stale_copies

    dead = tmp_path / "lmforge-vllm-compiled-999999999-abc"
    alive = tmp_path / f"lmforge-vllm-compiled-{os.getpid()}-def"
    for folder in (dead, alive):
        (folder / "modelinfos").mkdir(parents=True)
    _remove_stale_copies(tmp_path)
    assert not dead.exists() and alive.exists()


def test_compile_in_image_runs_the_images_own_compile_on_the_mounted_folder(tmp_path: Path) -> None:
    """``lmforge compile --image`` / ``deploy --compile``: the image's lmforge compiles the folder mounted
    read-write where SageMaker mounts it, as root (it writes into this user's folder), offline, with
    room in /dev/shm for vLLM's message queues, and with the endpoint's settings."""
    from lmforge.container.compile_in_image import compile_command
    from lmforge.container.engine import ContainerEngine

    cmd = compile_command(
        ContainerEngine("podman", "/x/podman"), "lmforge/vllm-cpu:0.1.0", tmp_path, {"OPTION_DTYPE": "fp32"}
    )
    assert cmd[:2] == ["/x/podman", "run"] and cmd[-3:] == [
        "lmforge/vllm-cpu:0.1.0",
        "compile",
        "/opt/ml/model",
    ]
    joined = " ".join(cmd)
    assert f"--volume {tmp_path.resolve()}:/opt/ml/model:rw" in joined
    assert "--entrypoint /opt/lmforge/bin/lmforge" in joined and "--user 0" in joined
    assert "--network none" in joined and "--shm-size 2g" in joined and "--env OPTION_DTYPE=fp32" in joined
    assert "--rm" in cmd
