"""``compile_first`` (``lmforge deploy --compile``): compile the model folder in place for vLLM before it
is packed, inside the image the endpoint will run, so the graphs match its vLLM, torch and exact Python
(:mod:`lmforge.container.compile_in_image`); only where this machine's CPU or GPU suits the instance
type (:func:`lmforge.deploy.compile_match.compile_here_problem`). Otherwise it says why and the folder
ships uncompiled: the endpoint compiles at its first start.
"""

from __future__ import annotations

from lmforge.deploy.endpoints import DeployError
from lmforge.deploy.progress import Progress
from lmforge.deploy.settings import DeploySettings

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
