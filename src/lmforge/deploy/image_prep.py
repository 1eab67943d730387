"""The image a deployment runs, made ready before anything is uploaded: chosen
(:func:`lmforge.deploy.images.choose_image`), refused when it cannot serve the configuration, and, for
lmforge's own image, found in the account's ECR (or built and pushed there with ``build_image``).

On the local SageMaker in image mode a GPU image cannot start on a machine without an NVIDIA GPU:
that is said first, with how to try the same model here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lmforge.deploy.endpoints import DeployError
from lmforge.deploy.progress import Progress

if TYPE_CHECKING:
    from lmforge.config import ServingConfig
    from lmforge.deploy.settings import DeploySettings


def prepare_image(settings: DeploySettings, config: ServingConfig, region: str, progress: Progress) -> str:
    """The URI of the image to deploy; DeployError when it cannot serve ``config`` or is not in ECR."""
    from lmforge.deploy.account import account_id
    from lmforge.deploy.images import ImageError, choose_image, image_problem

    instance_type = settings.instance_type
    account = account_id(region)
    try:
        choice = choose_image(settings.image, config, instance_type, region, account)
    except ImageError as exc:
        raise DeployError(str(exc)) from None
    if problem := image_problem(choice, config, instance_type):
        raise DeployError(f"image {choice.uri} cannot serve this model: {problem}")
    if choice.kind == "lmforge" and choice.flavour is not None:
        from lmforge.local.control import targeted_mode

        mode = targeted_mode()
        if mode == "process":
            progress.note(
                f"      the local SageMaker runs in process mode: lmforge's server stands in for {choice.uri}"
            )
        else:
            if mode == "image":
                refuse_gpu_image_without_gpu(
                    choice.flavour, config, instance_type, settings.model_dir, account, region
                )
            _ensure_in_ecr(choice.uri, choice.flavour, region, settings, progress)
    return choice.uri


def refuse_gpu_image_without_gpu(
    name: str, config: ServingConfig, instance_type: str, model_dir: Path, account: str, region: str
) -> None:
    """The local SageMaker runs images on this machine: a GPU image cannot start where there is no
    NVIDIA GPU. Say so first (not that the image is missing from ECR, whose build would then refuse),
    and how to try the same model here."""
    from lmforge.container.build import has_nvidia_gpu
    from lmforge.container.flavours import FlavourError, load_flavour
    from lmforge.deploy.images import CPU_FLAVOURS, lmforge_image_uri

    try:
        if not load_flavour(name).gpu or has_nvidia_gpu():
            return
    except FlavourError:
        return
    head = (
        f"{instance_type} takes lmforge's {name} image, which needs an NVIDIA GPU, and the local SageMaker "
        "runs endpoints on this machine, which has none (nvidia-smi finds no GPU)."
    )
    cpu = CPU_FLAVOURS.get(config.rolling_batch)
    if cpu is None:
        raise DeployError(
            f"{head} option.rolling_batch={config.rolling_batch} has no CPU image; to try this model here, "
            "set option.rolling_batch=lmi-dist (or vllm) and use a CPU instance type such as ml.m5.xlarge"
        )
    stand_in = lmforge_image_uri(cpu, account, region)
    raise DeployError(
        f"{head} To try this model here, either\n"
        f"  use a CPU instance type (lmforge's {cpu} image):\n"
        f"    lmforge deploy {model_dir} --instance-type ml.m5.xlarge ...\n"
        f"  or keep {instance_type} with the {cpu} image standing in for the GPU image (what runs is the "
        f"{cpu} image, not what a real {instance_type} endpoint would run):\n"
        f"    lmforge deploy {model_dir} --instance-type {instance_type} --image {stand_in} ...\n"
        f"Add --build-image if the {cpu} image is not in the local ECR yet."
    )


def _ensure_in_ecr(uri: str, flavour: str, region: str, settings: DeploySettings, progress: Progress) -> None:
    """An lmforge image named in the caller's ECR must be there: SageMaker would fail minutes later."""
    import boto3

    from lmforge.container.publish import image_in_ecr, parse_repository

    name, _, tag = uri.rpartition(":")
    repo = parse_repository(name)
    if repo is None:
        return  # not ECR (a local name for the local SageMaker, another registry)
    if image_in_ecr(boto3.client("ecr", region_name=repo.region), repo, tag):
        return
    if not settings.build_image:
        raise DeployError(
            f"{uri} is not in ECR yet. Build and push it first:\n"
            f"  lmforge container build {flavour} && lmforge container push {flavour}\n"
            f"or pass --build-image to do both now, or --image lmi for AWS's LMI image"
        )
    from lmforge import __version__
    from lmforge.container.build import build_flavour
    from lmforge.container.engine import EngineError, detect
    from lmforge.container.publish import EcrRepository, push_to_ecr
    from lmforge.deploy.images import lmforge_repository

    try:
        engine = detect(settings.container_engine)
        progress.note(f"      {uri} is not in ECR: building and pushing it (--build-image)")
        built = build_flavour(flavour, engine, progress.note)
        prefix = repo.name.rpartition("/")[0]
        target = EcrRepository(
            repo.host, f"{prefix}/{lmforge_repository(flavour)}" if prefix else lmforge_repository(flavour)
        )
        progress.note(f"pushing {built.tag} to {target.uri}:{__version__}")
        push_to_ecr(
            engine, boto3.client("ecr", region_name=region), built.tag, target, __version__, progress.note
        )
    except EngineError as exc:
        raise DeployError(str(exc)) from None
