"""``compile_first`` (``lmforge deploy --compile``): compile the model folder in place for vLLM before it
is packed, inside the image the endpoint will run, so the graphs match its vLLM, torch and exact Python
(:mod:`lmforge.container.compile_in_image`); only where this machine's CPU or GPU suits the instance
type (:func:`lmforge.deploy.compile_match.compile_here_problem`). Otherwise it says why and the folder
ships uncompiled: the endpoint compiles at its first start.

``quantize_before_packing`` (``lmforge deploy --compile --quantize METHOD``) writes the quantized
checkpoint first (``lmforge compile --quantize``, in the endpoint's image), into a folder of its own: that
folder is what is compiled for vLLM, planned, packed and deployed; the source folder is only read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from lmforge.deploy.endpoints import DeployError
from lmforge.deploy.progress import Progress
from lmforge.deploy.settings import DeploySettings

if TYPE_CHECKING:
    from lmforge.config import ServingConfig
    from lmforge.container.engine import ContainerEngine
    from lmforge.quantize import Method

SKIP = "      --compile: not compiling ({}); the endpoint compiles at its first start"


def compile_before_packing(settings: DeploySettings, image_uri: str, progress: Progress) -> bool:
    """Compile ``settings.model_dir`` with ``settings.environment`` when it can be a hit on the endpoint;
    True when it compiled. DeployError when the compile itself fails."""
    from lmforge.config import ConfigError, load_config
    from lmforge.container.compile_in_image import compile_in_image
    from lmforge.container.engine import EngineError, detect
    from lmforge.container.flavours import image_name
    from lmforge.container.refs import lmforge_flavour_of
    from lmforge.deploy.compile_match import compile_here_problem
    from lmforge.engines.vllm.compile_manifest import current_target

    environment = dict(settings.environment)
    try:
        resolved = load_config(settings.model_dir, env=environment)
    except ConfigError as exc:
        progress.note(SKIP.format(f"invalid configuration: {exc}"))
        return False
    rolling_batch = resolved.config.rolling_batch
    if rolling_batch != "vllm":
        progress.note(SKIP.format(f"option.rolling_batch={rolling_batch}: only vLLM compiles ahead"))
        return False
    flavour = lmforge_flavour_of(image_uri)
    if flavour is None:
        progress.note(
            SKIP.format(f"{image_uri} is not an lmforge image, whose lmforge compile would run the compile")
        )
        return False
    problem = compile_here_problem(settings.instance_type, current_target())
    if problem is not None:
        progress.note(SKIP.format(problem))
        return False
    try:
        compile_in_image(
            detect(settings.container_engine),
            image_name(flavour),
            settings.model_dir,
            env=environment,
            progress=lambda m: progress.note(f"      {m}"),
        )
    except EngineError as exc:
        raise DeployError(f"--compile: {exc}") from None
    return True


#: where the quantized checkpoint is written inside the image (its parent is mounted: the writer builds
#: the folder beside its final name and renames it into place)
QUANT_MOUNT = "/opt/lmforge-quantized"


def quantize_method(settings: DeploySettings, config: ServingConfig) -> Method | None:
    """The quantization a deployment asks for: ``settings.quantize`` (``--quantize``), else, with
    ``--compile``, an
    LMI-Dist folder's ``option.quantize`` (what ``lmforge compile`` reads). BadSetting naming the option
    and the choices when it cannot be had for this folder on this instance type, before anything runs."""
    from lmforge.deploy.instances import get_instance
    from lmforge.deploy.settings import BadSetting
    from lmforge.quantize import QuantizeError, method, quantization_config

    asked = settings.quantize
    if asked is None and not (
        settings.compile_first and config.quantize and config.rolling_batch == "lmi-dist"
    ):
        return None
    option = "--quantize" if asked is not None else "option.quantize"
    name = asked if asked is not None else str(config.quantize)
    if config.rolling_batch == "trtllm":
        raise BadSetting(
            f"{option} {name}: --quantize is for LMI-Dist and vLLM folders; a TensorRT-LLM folder quantizes "
            "with ModelOpt through its own option.quantize (lmforge compile DIR --output OUT)",
            "--quantize",
        )
    try:
        cpu_only = get_instance(settings.instance_type).is_cpu
    except ValueError:  # not in lmforge's table: the plan says so; the compile decides by its machine
        cpu_only = False
    try:
        chosen = method(name, option=option, cpu_only=cpu_only)
    except QuantizeError as exc:
        raise BadSetting(f"{exc.message} (instance type {settings.instance_type})", "--quantize") from None
    source = config.model_path
    if source is not None and quantization_config(source) is not None:
        if asked is None:  # quantized already: the start checks option.quantize against it
            return None
        raise BadSetting(
            f"--quantize {name}: {source} is already quantized (config.json has a quantization_config); "
            "deploy it without --quantize",
            "--quantize",
        )
    return chosen


def quantize_before_packing(
    settings: DeploySettings, image_uri: str, chosen: Method, output: Path, progress: Progress
) -> None:
    """``lmforge compile MODEL_DIR --quantize METHOD --output OUTPUT`` with ``settings.environment``:
    inside the endpoint's image when it is lmforge's (the libraries that write the checkpoint are then
    the ones that read it there, so its start check is a hit), on this machine when the local SageMaker
    runs in process mode (lmforge's server here stands in for the image) or the image is not
    lmforge's. DeployError when it fails; nothing is packed then."""
    from lmforge.container.flavours import image_name
    from lmforge.container.refs import lmforge_flavour_of
    from lmforge.local.control import targeted_mode

    flavour = lmforge_flavour_of(image_uri)
    if targeted_mode() == "process" or flavour is None:
        why = (
            "the local SageMaker runs in process mode"
            if flavour is not None
            else f"{image_uri} is not an lmforge image"
        )
        progress.note(f"      --quantize {chosen.name}: quantizing on this machine ({why})")
        _quantize_here(settings, chosen, output)
    else:
        progress.note(f"      --quantize {chosen.name}: quantizing inside {image_name(flavour)}")
        _quantize_in_image(settings, image_name(flavour), chosen, output, progress)
    progress.note(f"      --quantize {chosen.name}: deploying the quantized folder {output}")


def compile_args(model_dir: str, chosen: Method, output: str) -> list[str]:
    """The ``lmforge compile`` arguments that write the quantized checkpoint."""
    return ["compile", model_dir, "--quantize", chosen.name, "--output", output]


def _quantize_here(settings: DeploySettings, chosen: Method, output: Path) -> None:
    """This machine's ``lmforge compile``, with the endpoint's environment (not this shell's options)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SERVING_"))}
    env.update(settings.environment)
    argv = [sys.executable, "-m", "lmforge", *compile_args(str(settings.model_dir), chosen, str(output))]
    proc = subprocess.run(argv, env=env, stdout=sys.stderr, check=False)
    if proc.returncode != 0:
        raise DeployError(
            f"--quantize {chosen.name}: lmforge compile exited {proc.returncode} (its output is above)"
        )


def quantize_in_image_command(
    engine: ContainerEngine, image: str, model_dir: Path, chosen: Method, output: Path, env: Mapping[str, str]
) -> list[str]:
    """The engine command that runs the image's ``lmforge compile --quantize``: the model folder at
    SageMaker's mount, ``output``'s parent mounted read-write for the checkpoint."""
    from lmforge.container.compile_in_image import MOUNT, compile_command

    args = compile_command(engine, image, model_dir, env)
    assert args[-3:] == [image, "compile", MOUNT], args  # the engine's options come before the image
    volume = ["--volume", f"{output.parent.resolve()}:{QUANT_MOUNT}:rw"]
    return [*args[:-3], *volume, image, *compile_args(MOUNT, chosen, f"{QUANT_MOUNT}/{output.name}")]


def _quantize_in_image(
    settings: DeploySettings, image: str, chosen: Method, output: Path, progress: Progress
) -> None:
    import subprocess
    import sys

    from lmforge.container.engine import EngineError, detect

    try:
        engine = detect(settings.container_engine)
    except EngineError as exc:
        raise DeployError(f"--quantize: {exc}") from None
    if not engine.image_exists(image):
        raise DeployError(
            f"--quantize: {image} is not in {engine.kind}'s image store; build it first "
            "(lmforge container build)"
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    argv = quantize_in_image_command(engine, image, settings.model_dir, chosen, output, settings.environment)
    progress.note(f"      quantizing {settings.model_dir} inside {image} ({engine.kind})")
    proc = subprocess.run(argv, stdout=sys.stderr, check=False)
    if proc.returncode != 0:
        raise DeployError(
            f"--quantize {chosen.name}: lmforge compile inside {image} exited {proc.returncode} (its output "
            "is above)"
        )
