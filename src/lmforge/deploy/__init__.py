"""Deploying to SageMaker: planning, upload, endpoints.

:func:`deploy` is the whole of ``lmforge deploy`` as a function, for the command and for SDK-style
callers alike::

    from lmforge.deploy import DeploySettings, Progress, deploy

    done = deploy(
        DeploySettings(model_dir=Path("model"), endpoint_name="my-llm", instance_type="ml.g5.2xlarge"),
        Progress(note=print),
    )
    assert done.succeeded, done.result.description.get("FailureReason")

Importing this package imports neither boto3 nor click; each step imports what it needs when it runs.
"""

from lmforge.deploy.autoscaling import Autoscale
from lmforge.deploy.endpoints import DeployError, DeployResult
from lmforge.deploy.progress import Progress
from lmforge.deploy.settings import (
    BadSetting,
    DeploySettings,
    DeployUsageError,
    InvalidConfiguration,
    PlanDoesNotFit,
)
from lmforge.deploy.workflow import Deployment, deploy

__all__ = [
    "Autoscale",
    "BadSetting",
    "DeployError",
    "DeployResult",
    "DeploySettings",
    "DeployUsageError",
    "Deployment",
    "InvalidConfiguration",
    "PlanDoesNotFit",
    "Progress",
    "deploy",
]
