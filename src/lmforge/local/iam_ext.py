"""IAM on the local SageMaker: the execution role ``lmforge local up`` creates, and
``iam:SimulatePrincipalPolicy``, which moto 5.2 lacks (it answers an HTML 500).

What the SageMaker Python SDK asks of IAM and STS, read in its source (sagemaker-core 2.27.0,
``sagemaker.core.helper.iam_role_resolver.resolve_and_validate_role``, which v3's ``ModelBuilder``
calls on ``build()`` and again on ``deploy()``):

- ``iam:SimulatePrincipalPolicy`` (paginated, ``PolicySourceArn`` = the role, ``ActionNames`` = the
  role type's actions whose policy resource is ``*``; for ``serving``: ``ecr:GetAuthorizationToken``),
  then ``iam:GetRole`` for the trust policy, which must let ``sagemaker.amazonaws.com`` assume it;
  a role given by name rather than ARN is resolved with ``iam:GetRole`` first;
- with no role at all, ``sts:GetCallerIdentity`` and ``iam:GetRole`` for the caller's own role;
- ``sts:GetCallerIdentity`` for the account (telemetry, S3 ownership checks, the default bucket).

moto answers all of these but the first; :func:`install` adds it (:func:`simulate_principal_policy`,
evaluated by :mod:`lmforge.local.iam_policy`) and :func:`ensure_execution_role` creates the role
``LMFORGE_ROLE_ARN`` names, trusted by SageMaker and allowed what an endpoint's execution role
needs. STS calls the SDK makes at a hard-coded regional URL (``sts.REGION.amazonaws.com``, for
the default bucket's name) cannot be redirected by any server: see examples/sagemaker_sdk_v3.py.

``check_compatible()`` fails loudly, naming each attribute and the moto version tested, when a moto
upgrade removes what this relies on (:data:`REACHES`; see :mod:`lmforge.local.moto_patch`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from lmforge.local.iam_policy import Evaluation, Policy, PolicyError, evaluate, parse_policy
from lmforge.local.moto_patch import Patch, Reach, apply, check, patched_reaches

EXECUTION_ROLE_NAME = "lmforge-local"
EXECUTION_POLICY_NAME = "lmforge-local-execution"

#: who may assume the execution role: SageMaker, as for any endpoint's execution role
TRUST_POLICY: dict[str, Any] = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "sagemaker.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ],
}

#: what an endpoint's execution role needs: read the model data, pull the image, write logs and metrics
EXECUTION_POLICY: dict[str, Any] = {
    "Version": "2012-10-17",
    "Statement": [
        {"Sid": "ModelData", "Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "*"},
        {
            "Sid": "Images",
            "Effect": "Allow",
            "Action": [
                "ecr:GetAuthorizationToken",
                "ecr:BatchCheckLayerAvailability",
                "ecr:GetDownloadUrlForLayer",
                "ecr:BatchGetImage",
            ],
            "Resource": "*",
        },
        {
            "Sid": "Logs",
            "Effect": "Allow",
            "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": "arn:aws:logs:*:*:log-group:/aws/sagemaker/*",
        },
        {"Sid": "Metrics", "Effect": "Allow", "Action": "cloudwatch:PutMetricData", "Resource": "*"},
    ],
}

DEFAULT_MAX_ITEMS = 100
RESPONSE = "moto.iam.responses:IamResponse"


def _moto() -> tuple[Any, Any]:
    from moto.iam import exceptions as errors
    from moto.iam import models

    return models, errors


def simulate_principal_policy_action(self: Any) -> Any:
    """The ``SimulatePrincipalPolicy`` action on moto's ``IamResponse`` (moto routes the action here)."""
    from moto.core.responses import ActionResult

    params = {
        name: self._get_param(name)
        for name in (
            "PolicySourceArn",
            "PolicyInputList",
            "PermissionsBoundaryPolicyInputList",
            "ActionNames",
            "ResourceArns",
            "ContextEntries",
            "MaxItems",
            "Marker",
        )
    }
    return ActionResult(simulate_principal_policy(self.backend, params))


#: the action added to moto's IAM
PATCHES: tuple[Patch, ...] = (
    Patch(RESPONSE, "simulate_principal_policy", simulate_principal_policy_action, adds=True),
)

#: the moto attributes this module uses
REACHES: tuple[Reach, ...] = (
    Reach(RESPONSE, ("backend", "_get_param")),
    Reach("moto.core.responses", ("ActionResult",)),
    Reach(
        "moto.iam.models:IAMBackend",
        (
            "get_role",
            "get_user",
            "get_group",
            "get_groups_for_user",
            "get_policy",
            "create_role",
            "put_role_policy",
        ),
    ),
    Reach("moto.iam.models", ("iam_backends", "AWSManagedPolicy")),
    Reach("moto.iam.models:ManagedPolicy", ("arn",)),
    Reach("moto.iam.models:ManagedPolicy", ("versions",), set_in="__init__"),
    Reach("moto.iam.models:PolicyVersion", ("document", "is_default"), set_in="__init__"),
    Reach("moto.iam.models:Role", ("arn",)),
    Reach("moto.iam.models:Role", ("policies", "managed_policies"), set_in="__init__"),
    Reach("moto.iam.models:User", ("arn",)),
    Reach("moto.iam.models:User", ("policies", "managed_policies"), set_in="__init__"),
    Reach("moto.iam.models:Group", ("arn",)),
    Reach("moto.iam.models:Group", ("policies", "managed_policies"), set_in="__init__"),
    Reach("moto.iam.exceptions", ("NotFoundException", "InvalidInput")),
)


def check_compatible() -> None:
    """Raise RuntimeError, naming each attribute and the moto version tested, when the installed moto
    lacks what this module relies on."""
    check("lmforge.local.iam_ext", (*patched_reaches(PATCHES), *REACHES))


def install() -> None:
    """Answer ``SimulatePrincipalPolicy`` in moto's IAM (idempotent per process)."""
    check_compatible()
    apply(PATCHES)


def ensure_execution_role(account_id: str, partition: str = "aws") -> str:
    """Create the local execution role (once) in moto's IAM; its ARN."""
    models, errors = _moto()
    backend = models.iam_backends[account_id][partition]
    try:
        role = backend.get_role(EXECUTION_ROLE_NAME)
    except errors.NotFoundException:
        role = backend.create_role(
            EXECUTION_ROLE_NAME,
            json.dumps(TRUST_POLICY),
            "/",
            None,
            "The execution role of lmforge's local SageMaker endpoints",
            [],
            "3600",
        )
    if EXECUTION_POLICY_NAME not in role.policies:
        backend.put_role_policy(EXECUTION_ROLE_NAME, EXECUTION_POLICY_NAME, json.dumps(EXECUTION_POLICY))
    return str(role.arn)


def simulate_principal_policy(backend: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    """``SimulatePrincipalPolicy``'s response for the request ``params`` (botocore's member names)."""
    _, errors = _moto()
    actions = list(params.get("ActionNames") or [])
    if not actions:
        raise errors.InvalidInput("ActionNames must name at least one action.")
    source = str(params.get("PolicySourceArn") or "")
    try:
        policies = principal_policies(backend, source)
        policies += [
            parse_policy(doc, f"PolicyInputList.{i}", "none")
            for i, doc in enumerate(params.get("PolicyInputList") or [], 1)
        ]
        boundary = _boundary(backend, source, params.get("PermissionsBoundaryPolicyInputList"))
    except PolicyError as exc:
        raise errors.InvalidInput(str(exc)) from exc
    context = {
        str(entry.get("ContextKeyName")): [str(v) for v in entry.get("ContextKeyValues") or []]
        for entry in params.get("ContextEntries") or []
    }
    resources = list(params.get("ResourceArns") or ["*"])
    results = [
        evaluate(policies, action, resource, boundary=boundary, context=context)
        for action in actions
        for resource in resources
    ]
    start = _marker(params.get("Marker"), len(results), errors)
    count = int(params.get("MaxItems") or DEFAULT_MAX_ITEMS)
    page = results[start : start + count]
    out: dict[str, Any] = {"EvaluationResults": [_result(r) for r in page], "IsTruncated": False}
    if start + count < len(results):
        out.update(IsTruncated=True, Marker=str(start + count))
    return out


def principal_policies(backend: Any, arn: str) -> list[Policy]:
    """The identity-based policies of the role, user (with its groups') or group ``arn`` names."""
    _, errors = _moto()
    kind, _, path_name = arn.partition(":iam::")[2].partition(":")[2].partition("/")
    name = path_name.rsplit("/", 1)[-1]
    if not arn.startswith("arn:") or kind not in ("role", "user", "group") or not name:
        raise errors.InvalidInput(f"Invalid ARN for PolicySourceArn: {arn!r} (a role, user or group ARN)")
    try:
        entity = {"role": backend.get_role, "user": backend.get_user, "group": backend.get_group}[kind](name)
    except errors.NotFoundException:
        raise errors.NotFoundException(f"The {kind} with name {name} cannot be found.") from None
    if str(entity.arn) != arn:
        raise errors.NotFoundException(f"The {kind} with ARN {arn} cannot be found.")
    owners = [(kind, entity)]
    if kind == "user":
        owners += [("group", group) for group in backend.get_groups_for_user(name)]
    out: list[Policy] = []
    for owner_kind, owner in owners:
        out += [parse_policy(doc, policy_name, owner_kind) for policy_name, doc in owner.policies.items()]
        out += [_managed(policy) for policy in owner.managed_policies.values()]
    return out


def _managed(policy: Any) -> Policy:
    from moto.iam.models import AWSManagedPolicy

    document = next((v.document for v in policy.versions if v.is_default), "")
    kind = "aws-managed" if isinstance(policy, AWSManagedPolicy) else "user-managed"
    return parse_policy(document, str(policy.arn), kind)


def _boundary(backend: Any, source: str, inputs: Sequence[str] | None) -> list[Policy] | None:
    if inputs:
        names = (f"PermissionsBoundaryPolicyInputList.{i}" for i in range(1, len(inputs) + 1))
        return [parse_policy(doc, name, "none") for name, doc in zip(names, inputs, strict=True)]
    if ":role/" not in source and ":user/" not in source:
        return None
    name = source.rsplit("/", 1)[-1]
    entity = backend.get_role(name) if ":role/" in source else backend.get_user(name)
    arn = getattr(entity, "permissions_boundary_arn", None)
    return [_managed(backend.get_policy(arn))] if arn else None


def _marker(marker: Any, total: int, errors: Any) -> int:
    if marker in (None, ""):
        return 0
    if not str(marker).isdigit() or int(marker) > total:
        raise errors.InvalidInput(f"Invalid Marker: {marker!r}")
    return int(marker)


def _result(evaluation: Evaluation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "EvalActionName": evaluation.action,
        "EvalResourceName": evaluation.resource,
        "EvalDecision": evaluation.decision,
        "MatchedStatements": [
            {"SourcePolicyId": p.source_id, "SourcePolicyType": p.source_type} for p in evaluation.matched
        ],
        "MissingContextValues": list(evaluation.missing_context),
    }
    if (by_boundary := evaluation.allowed_by_boundary) is not None:
        out["PermissionsBoundaryDecisionDetail"] = {"AllowedByPermissionsBoundary": by_boundary}
    return out
