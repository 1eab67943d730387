"""Adapter sources and checks without a server: S3 allow-list (moto), names, config fields."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lmforge.adapters.registry import check_name
from lmforge.adapters.sources import SourcePolicy
from lmforge.adapters.validate import AdapterError, check_files, check_weights, read_config
from lmforge.errors import BadRequestError


@pytest.mark.parametrize("name", ["", "../a", "a/b", ".hidden", "a" * 129, "a b", "..", "a\x00"])
def test_bad_names(name: str) -> None:
    with pytest.raises(BadRequestError) as err:
        check_name(name)
    assert err.value.param == "name"


@pytest.mark.parametrize("name", ["a1", "my-adapter_v2.1", "A" * 128])
def test_good_names(name: str) -> None:
    assert check_name(name) == name


def test_s3_sources_only_under_allowed_prefixes(tmp_path: Path, lora_adapters: dict[str, Path]) -> None:
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bkt")
        for f in lora_adapters["a1"].iterdir():
            s3.upload_file(str(f), "bkt", f"adapters/a1/{f.name}")
        s3.put_object(Bucket="bkt", Key="adapters-other/x/adapter_config.json", Body=b"{}")
        policy = SourcePolicy(roots=[], s3_prefixes=["s3://bkt/adapters/"], cache_dir=tmp_path, s3_client=s3)
        folder, root = policy.resolve("s3://bkt/adapters/a1")
        assert (folder / "adapter_model.safetensors").is_file() and policy.owns(folder)
        check_files(folder, root)
        # a sibling prefix that merely starts with the allowed one, and climbing out, are refused
        for src in (
            "s3://bkt/adapters-other/x",
            "s3://bkt/adapters/../adapters-other/x",
            "s3://other/adapters/a1",
        ):
            with pytest.raises(AdapterError) as err:
                policy.resolve(src)
            assert err.value.param == "src"
        with pytest.raises(AdapterError, match="no objects"):
            policy.resolve("s3://bkt/adapters/missing")
        # each registration downloads into its own folder
        again, _ = policy.resolve("s3://bkt/adapters/a1")
        assert again != folder


def test_config_checks(tmp_path: Path, lora_adapters: dict[str, Path]) -> None:
    src = lora_adapters["a1"]
    cases = {
        "peft_type": ("PREFIX_TUNING", "only LORA"),
        "r": (0, "positive integer"),
        "use_dora": (True, "not supported"),
        "modules_to_save": (["lm_head"], "not supported"),
        "bias": ("all", "only 'none'"),
        "target_modules": ([], "non-empty list"),
    }
    for field, (value, needle) in cases.items():
        folder = tmp_path / field
        shutil.copytree(src, folder)
        data = json.loads((folder / "adapter_config.json").read_text())
        data[field] = value
        (folder / "adapter_config.json").write_text(json.dumps(data))
        with pytest.raises(AdapterError) as err:
            read_config(folder, max_rank=64)
        assert field in err.value.message and needle in err.value.message


def test_weights_must_match_the_base(tiny_model: Path, lora_adapters: dict[str, Path]) -> None:
    from lmforge.adapters.validate import linear_layers_from_folder

    layers = linear_layers_from_folder(tiny_model)
    assert layers["model.layers.0.self_attn.q_proj"] == (128, 128)
    data = read_config(lora_adapters["a2"], max_rank=16)
    shapes, size = check_weights(lora_adapters["a2"], data, layers)
    assert {s.module.rsplit(".", 1)[-1] for s in shapes} == {"q_proj", "v_proj"} and size > 0
    smaller = {k: (v[0] // 2, v[1]) for k, v in layers.items()}  # another model's widths
    with pytest.raises(AdapterError, match=r"lora_A \[4, 128\]"):
        check_weights(lora_adapters["a2"], data, smaller)


def test_local_roots(tmp_path: Path, lora_adapters: dict[str, Path]) -> None:
    root = tmp_path / "root"
    shutil.copytree(lora_adapters["a1"], root / "a1")
    policy = SourcePolicy(roots=[root.resolve()], cache_dir=tmp_path / "cache")
    assert policy.resolve("a1")[0] == (root / "a1").resolve()  # relative to the first root
    assert policy.resolve(str(root / "a1"))[0] == (root / "a1").resolve()
    for src in (str(root), "/", "~/x", "ftp://x/y", ""):
        with pytest.raises(AdapterError):
            policy.resolve(src)
