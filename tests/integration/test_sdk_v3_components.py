"""The SageMaker SDK v3's sagemaker-core resources against the local SageMaker's inference
components: ``InferenceComponent.create`` on an endpoint made for components (``Model``,
``EndpointConfig`` with ``ManagedInstanceScaling``, ``Endpoint``), ``wait_for_status``,
``Endpoint.invoke`` with ``inference_component_name``, ``update_runtime_configs`` to two copies,
``update`` with a rolling ``InferenceComponentDeploymentConfig``, then deleted.

v3 runs in a subprocess with only v3's ``sagemaker`` importable (tests/sdk3.py); the copies serve a
user's ``model.py`` (tests/local_sagemaker.py's handler: no model).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.local_sagemaker import boto3_clients, handler_model
from tests.sdk3 import ensure_sdk3, run_v3, sdk3_env

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("local-sagemaker")]

V3_COMPONENTS = """
import json
import sys
import time

import boto3
from sagemaker.core.resources import Endpoint, EndpointConfig, InferenceComponent, Model
from sagemaker.core.shapes import (
    ContainerDefinition,
    InferenceComponentCapacitySize,
    InferenceComponentComputeResourceRequirements,
    InferenceComponentContainerSpecification,
    InferenceComponentDeploymentConfig,
    InferenceComponentRollingUpdatePolicy,
    InferenceComponentRuntimeConfig,
    InferenceComponentSpecification,
    ProductionVariant,
    ProductionVariantManagedInstanceScaling,
)

model_data, role, name = sys.argv[1:4]
session = boto3.session.Session()
model = Model.create(
    model_name=name,
    primary_container=ContainerDefinition(image="lmforge:cpu", model_data_url=model_data),
    execution_role_arn=role,
    session=session,
)
config = EndpointConfig.create(
    endpoint_config_name=name,
    execution_role_arn=role,
    production_variants=[
        ProductionVariant(
            variant_name="AllTraffic",
            instance_type="ml.m5.xlarge",
            initial_instance_count=1,
            managed_instance_scaling=ProductionVariantManagedInstanceScaling(
                status="ENABLED", min_instance_count=1, max_instance_count=2
            ),
        )
    ],
    session=session,
)
endpoint = Endpoint.create(endpoint_name=name, endpoint_config_name=name, session=session)
endpoint.wait_for_status("InService", poll=1, timeout=120)
requirements = InferenceComponentComputeResourceRequirements(
    number_of_cpu_cores_required=1, min_memory_required_in_mb=1024
)
component = InferenceComponent.create(
    inference_component_name=f"{name}-ic",
    endpoint_name=name,
    variant_name="AllTraffic",
    specification=InferenceComponentSpecification(
        model_name=name, compute_resource_requirements=requirements
    ),
    runtime_config=InferenceComponentRuntimeConfig(copy_count=1),
    session=session,
)
component.wait_for_status("InService", poll=1, timeout=180)
body = json.dumps({"inputs": "x", "parameters": {"max_new_tokens": 2}})
answer = endpoint.invoke(body=body, content_type="application/json", inference_component_name=f"{name}-ic")
print("ANSWER", json.loads(answer.body.read())["generated_text"])

component.update_runtime_configs(desired_runtime_config=InferenceComponentRuntimeConfig(copy_count=2))
for _ in range(600):  # poll for the second copy
    component.refresh()
    if component.runtime_config.current_copy_count == 2:
        break
    time.sleep(0.2)
print("COPIES", component.runtime_config.desired_copy_count, component.runtime_config.current_copy_count)

policy = InferenceComponentRollingUpdatePolicy(
    maximum_batch_size=InferenceComponentCapacitySize(type="COPY_COUNT", value=1),
    wait_interval_in_seconds=1,  # sagemaker-core serializes no 0 here (botocore then refuses it)
)
component.update(
    specification=InferenceComponentSpecification(
        model_name=name,
        compute_resource_requirements=requirements,
        container=InferenceComponentContainerSpecification(environment={"ROLLED": "1"}),
    ),
    deployment_config=InferenceComponentDeploymentConfig(rolling_update_policy=policy),
)
print("UPDATING", component.inference_component_status)
component.wait_for_status("InService", poll=1, timeout=180)
component.refresh()
print("ROLLED", component.specification.container.environment, component.runtime_config.current_copy_count)
print("LAST", component.last_deployment_config.rolling_update_policy.maximum_batch_size.value)
answer = endpoint.invoke(body=body, content_type="application/json", inference_component_name=f"{name}-ic")
print("ANSWER", json.loads(answer.body.read())["generated_text"])

component.delete()
component.wait_for_delete(poll=1, timeout=120)
endpoint.delete()
config.delete()
model.delete()
print("DELETED")
"""


def test_sagemaker_core_creates_scales_and_rolls_a_component(
    local: dict[str, str], tiny_model: Path, tmp_path: Path
) -> None:
    from lmforge.artifacts import package_model

    clients = boto3_clients(local, "s3", "sagemaker")
    s3, sm = clients["s3"], clients["sagemaker"]
    folder = handler_model(tiny_model, tmp_path / "model")
    archive = package_model(folder, tmp_path / "model.tar.gz").output
    try:
        s3.create_bucket(
            Bucket="sdk3-components", CreateBucketConfiguration={"LocationConstraint": "us-west-2"}
        )
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    s3.upload_file(str(archive), "sdk3-components", "model.tar.gz")
    script = tmp_path / "v3_components.py"
    script.write_text(textwrap.dedent(V3_COMPONENTS))
    env = sdk3_env(local, ensure_sdk3(), tmp_path)
    proc = run_v3(
        env, script, "s3://sdk3-components/model.tar.gz", local["LMFORGE_ROLE_ARN"], "sdk3-components"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the SDK's progress panels share stdout (without a newline before the next line)
    lines = re.findall(r"((?:ANSWER|COPIES|UPDATING|ROLLED|LAST|DELETED)\b.*)$", proc.stdout, re.M)
    assert lines == [
        "ANSWER xx",
        "COPIES 2 2",
        "UPDATING Updating",
        "ROLLED {'ROLLED': '1'} 2",
        "LAST 1",
        "ANSWER xx",
        "DELETED",
    ], proc.stdout + proc.stderr
    described: Any = sm.list_inference_components(EndpointNameEquals="sdk3-components")
    assert described["InferenceComponents"] == []
