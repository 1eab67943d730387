"""One deployment, start to end: :func:`deploy` is what ``lmforge deploy`` runs, for any caller.

The steps, each refused before anything is uploaded where it can be:

1. check the settings and resolve the folder's configuration; the region;
2. the image (:func:`lmforge.deploy.image_prep.prepare_image`), the optional quantization and compile
   (:mod:`lmforge.deploy.precompile`), the memory plan (:func:`plan_deployment`), the role;
3. the endpoint as it is (a Failed one deleted with ``replace``; one that cannot be updated refused);
4. package and upload the folder (:func:`lmforge.deploy.upload.upload_model_folder`);
5. create the model, endpoint configuration and endpoint, or update it; wait; autoscaling. With
   ``settings.inference_component``, step 5 is :func:`lmforge.deploy.components.deploy_component`
   instead: the endpoint created for components when absent, the component created or updated.

Progress goes to a :class:`~lmforge.deploy.progress.Progress`; the outcome comes back as a
:class:`Deployment`, whether the endpoint came up or not (a failed endpoint is an answer, not an
exception). Errors that stop a deployment are :class:`~lmforge.deploy.endpoints.DeployError`\\ s (see
:mod:`lmforge.deploy.settings` for the kinds); AWS's own refusals come as boto3 raised them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmforge.deploy.endpoints import DeployError, DeployResult, EndpointSpec
from lmforge.deploy.progress import Progress
from lmforge.deploy.settings import (
    BadSetting,
    DeploySettings,
    DeployUsageError,
    InvalidConfiguration,
    PlanDoesNotFit,
    check_settings,
)

if TYPE_CHECKING:
    from lmforge.config import ServingConfig
    from lmforge.deploy.autoscaling import Autoscale
    from lmforge.deploy.components import ComponentResult, ComponentSpec
    from lmforge.deploy.plan import DeployPlan
    from lmforge.deploy.upload import UploadResult

ROLE_ENV = "LMFORGE_ROLE_ARN"


@dataclass(frozen=True)
class Deployment:
    """What :func:`deploy` did: SageMaker's answer (``result``) and what went into it."""

    result: DeployResult | ComponentResult
    """The endpoint's answer, or the inference component's (``settings.inference_component``)."""
    spec: EndpointSpec | ComponentSpec
    """The model and variant (or component) as created (image, model data, timeouts, environment)."""
    upload: UploadResult
    plan: DeployPlan | None
    """None when no plan could be made (it was skipped, and said why)."""
    autoscale: Autoscale | None
    """The scaling registered once the endpoint was InService (the settings', else the one the
    endpoint had before an update), or None."""
    waited: bool

    @property
    def endpoint_name(self) -> str:
        return self.result.endpoint_name

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def succeeded(self) -> bool:
        """InService on the configuration this deployment made (False without waiting)."""
        return self.result.succeeded


def deploy(settings: DeploySettings, progress: Progress | None = None) -> Deployment:
    """Validate, plan, package, upload and deploy ``settings.model_dir``, then (with ``settings.wait``)
    wait for the endpoint. See the module's docstring for the steps and what each may raise.

    ``settings.quantize`` (``lmforge deploy --compile --quantize METHOD``; it needs ``compile_first``):
    the folder is quantized first by ``lmforge compile --quantize`` into a temporary folder, which is
    what is compiled, planned, packed and deployed; with ``compile_first`` alone, an LMI-Dist folder's
    ``option.quantize`` is quantized likewise. A bad method is a BadSetting before anything runs."""
    import dataclasses
    import tempfile
    from contextlib import ExitStack
    from pathlib import Path

    from lmforge.config import ConfigError, load_config
    from lmforge.deploy.account import resolve_region, where
    from lmforge.deploy.image_prep import prepare_image
    from lmforge.deploy.precompile import compile_before_packing, quantize_before_packing, quantize_method

    progress = progress or Progress()
    check_settings(settings)
    try:
        resolved = load_config(settings.model_dir, env={})
    except ConfigError as exc:
        raise InvalidConfiguration(exc) from None
    chosen = quantize_method(settings, resolved.config)
    region = resolve_region(settings.region)
    progress.note(f"[1/5] configuration OK ({settings.model_dir}); target: {where()} in {region}")

    image_uri = prepare_image(settings, resolved.config, region, progress)
    role_arn = settings.role_arn or os.environ.get(ROLE_ENV)
    if not role_arn:
        raise DeployUsageError(
            "no execution role: pass --role arn:aws:iam::ACCOUNT:role/NAME (a role SageMaker can assume "
            f"with read access to the bucket) or set {ROLE_ENV}"
        )
    with ExitStack() as stack:
        config = resolved.config
        if chosen is not None:
            # rootful engines leave root's files in it: removed as far as this user may
            tmp = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="lmforge-quantized-", ignore_cleanup_errors=True)
            )
            out = Path(tmp) / settings.model_dir.resolve().name
            quantize_before_packing(settings, image_uri, chosen, out, progress)
            settings = dataclasses.replace(settings, model_dir=out)
            try:
                config = load_config(out, env={}).config
            except ConfigError as exc:
                raise InvalidConfiguration(exc) from None
        # LMI-Dist has nothing more to compile once quantized (its --compile note would say otherwise)
        if settings.compile_first and not (chosen is not None and config.rolling_batch == "lmi-dist"):
            compile_before_packing(settings, image_uri, progress)
        plan = plan_deployment(settings, config, progress)
        return _ship(settings, region, image_uri, role_arn, plan, progress)


def _ship(
    settings: DeploySettings,
    region: str,
    image_uri: str,
    role_arn: str,
    plan: DeployPlan | None,
    progress: Progress,
) -> Deployment:
    """Steps 3 to 5: the endpoint as it is, the upload, the endpoint as asked. A deployment of another
    shape (an inference component on the endpoint) is one more settings field and another step 5."""
    from lmforge.artifacts import PackageError
    from lmforge.deploy import autoscaling
    from lmforge.deploy.account import default_bucket
    from lmforge.deploy.endpoints import (
        delete_endpoint,
        deploy_endpoint,
        describe_endpoint,
        preflight,
        sagemaker_client,
    )
    from lmforge.deploy.upload import split_s3_uri, upload_model_folder

    name = settings.endpoint_name
    sm = sagemaker_client(region)
    existing = describe_endpoint(sm, name)
    if existing is not None and existing["EndpointStatus"] == "Failed" and settings.replace:
        delete_endpoint(sm, name, echo=progress.note)
    existing = preflight(sm, name)  # refuse before uploading anything
    target = f"s3://{settings.bucket or default_bucket(region)}/{settings.s3_prefix.strip('/')}"
    try:
        split_s3_uri(target)
    except ValueError as exc:
        raise BadSetting(str(exc)) from None
    try:
        upload = upload_model_folder(
            settings.model_dir, target, region, settings.artifact_format, progress, step="[3/5]"
        )
    except PackageError as exc:
        raise DeployError(str(exc)) from None
    if settings.inference_component is not None:
        return _ship_component(settings, sm, image_uri, role_arn, plan, upload, progress)
    spec = endpoint_spec(settings, image_uri, role_arn, upload.model_data(), plan)
    progress.note(f"[4/5] image {spec.image_uri}")
    progress.note("[5/5] deploying")
    aas = autoscaling.client(region)
    # SageMaker refuses to update a variant registered for autoscaling: off now, back on after
    previous = autoscaling.suspend(aas, name, spec.variant_name, progress.note) if existing else None
    result = deploy_endpoint(sm, spec, wait=settings.wait, echo=progress.note)
    keep = settings.autoscale or previous
    registered = None
    if result.status == "InService" and keep is not None:
        autoscaling.register(aas, name, spec.variant_name, keep, progress.note)
        registered = keep
    return Deployment(result, spec, upload, plan, registered, settings.wait)


def _ship_component(
    settings: DeploySettings,
    sm: Any,
    image_uri: str,
    role_arn: str,
    plan: DeployPlan | None,
    upload: UploadResult,
    progress: Progress,
) -> Deployment:
    """Step 5 for an inference component: its requirements (the settings', else the plan's), then
    :func:`~lmforge.deploy.components.deploy_component`."""
    from lmforge.deploy.components import ComponentSpec, default_requirements, deploy_component

    assert settings.inference_component is not None
    needs = default_requirements(
        settings.instance_type,
        plan,
        cpus=settings.cpus,
        memory_mb=settings.memory_mb,
        accelerators=settings.accelerators,
    )
    spec = ComponentSpec(
        endpoint_name=settings.endpoint_name,
        component_name=settings.inference_component,
        instance_type=settings.instance_type,
        image_uri=image_uri,
        role_arn=role_arn,
        model_data=upload.model_data(),
        requirements=needs,
        copies=settings.copies,
        instance_count=settings.instance_count,
        max_instance_count=settings.max_instance_count,
        environment=dict(settings.environment),
        health_check_timeout_s=settings.health_check_timeout_s
        or (plan.health_check_timeout_s if plan else None),
        download_timeout_s=settings.download_timeout_s or (plan.download_timeout_s if plan else None),
        routing_strategy=settings.routing_strategy,
    )
    progress.note(f"[4/5] image {spec.image_uri}")
    progress.note(
        f"[5/5] deploying inference component {spec.component_name}: {spec.copies} x "
        f"({needs.cpus:g} cores, {needs.memory_mb} MiB, {needs.accelerators} accelerators)"
    )
    result = deploy_component(sm, spec, wait=settings.wait, echo=progress.note)
    registered = None
    if settings.autoscale is not None and result.status == "InService":
        from lmforge.deploy import autoscaling

        region = sm.meta.region_name
        autoscaling.register_component(
            autoscaling.client(region),
            autoscaling.cloudwatch_client(region),
            spec.component_name,
            settings.autoscale,
            progress.note,
        )
        registered = settings.autoscale
    return Deployment(result, spec, upload, plan, registered, settings.wait)


def endpoint_spec(
    settings: DeploySettings,
    image_uri: str,
    role_arn: str,
    model_data: dict[str, Any],
    plan: DeployPlan | None,
) -> EndpointSpec:
    """The model and variant to create: the settings' timeouts, else the plan's."""
    return EndpointSpec(
        endpoint_name=settings.endpoint_name,
        instance_type=settings.instance_type,
        instance_count=settings.instance_count,
        image_uri=image_uri,
        role_arn=role_arn,
        model_data=model_data,
        environment=dict(settings.environment),
        health_check_timeout_s=settings.health_check_timeout_s
        or (plan.health_check_timeout_s if plan else None),
        download_timeout_s=settings.download_timeout_s or (plan.download_timeout_s if plan else None),
        volume_size_gb=settings.volume_size_gb,
        routing_strategy=settings.routing_strategy,
    )


def plan_deployment(settings: DeploySettings, config: ServingConfig, progress: Progress) -> DeployPlan | None:
    """The memory plan, reported; PlanDoesNotFit when it does not fit unless ``force``; None (said why)
    when it cannot be made; DeployUsageError for an instance type SageMaker does not have."""
    from lmforge.deploy.instances import sagemaker_instance_types
    from lmforge.deploy.plan import PlanError, make_plan, render_plan

    instance_type = settings.instance_type
    try:
        plan = make_plan(settings.model_dir, config, instance_type, model_config_path=settings.model_config)
    except PlanError as exc:
        progress.note(f"[2/5] plan skipped: {exc}")
        return None
    except ValueError as exc:  # not in the planning table
        if instance_type not in sagemaker_instance_types():
            raise DeployUsageError(str(exc)) from None
        progress.note(
            f"[2/5] plan skipped: lmforge does not know the memory of {instance_type} (not in its table)"
        )
        return None
    progress.note("[2/5] plan")
    for line in render_plan(plan).splitlines():
        progress.note("      " + line)
    if not plan.fits:
        if not settings.force:
            raise PlanDoesNotFit(plan)
        progress.note("warning: deploying although the plan does not fit (--force)")
    return plan
