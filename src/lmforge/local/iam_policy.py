"""IAM policy evaluation for ``iam:SimulatePrincipalPolicy`` on the local SageMaker.

The rules of AWS's policy simulator for identity-based policies (no AWS code involved):

- a statement applies to an action and a resource when its ``Action`` (or ``NotAction``) and its
  ``Resource`` (or ``NotResource``) match them; ``*`` and ``?`` are wildcards, actions compare
  without case, resources with case; no ``Resource`` at all matches every resource;
- an applicable ``Deny`` wins (``explicitDeny``); else an applicable ``Allow`` allows (``allowed``);
  else the action is denied by default (``implicitDeny``);
- a permissions boundary also has to allow what the identity policies allow (and its ``Deny`` is an
  ``explicitDeny`` as well);
- a statement with a ``Condition`` is judged only where every key it tests was given as a context
  entry; otherwise it does not apply and its keys are reported as missing, which is what the real
  simulator answers for a request without context entries. Given keys are compared with the
  ``String*``, ``Arn*`` and ``Bool`` operators (an ``...IfExists`` operator is true without its key);
  any other operator makes the statement not apply.

A document that is not a JSON object with ``Statement`` raises :class:`PolicyError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from urllib.parse import unquote

ALLOWED = "allowed"
EXPLICIT_DENY = "explicitDeny"
IMPLICIT_DENY = "implicitDeny"


class PolicyError(ValueError):
    """A policy document that cannot be read (the message names the policy)."""


@dataclass(frozen=True)
class Policy:
    """One policy document and where it came from, as ``MatchedStatements`` names it."""

    source_id: str
    """The inline policy's name, the managed policy's ARN, or ``PolicyInputList.N``."""
    source_type: str
    """``role``, ``user``, ``group`` (inline), ``user-managed``, ``aws-managed`` or ``none``."""
    statements: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class Evaluation:
    """The simulator's verdict for one action on one resource."""

    action: str
    resource: str
    decision: str
    matched: tuple[Policy, ...] = ()
    missing_context: tuple[str, ...] = ()
    allowed_by_boundary: bool | None = None
    """None without a permissions boundary."""


@dataclass
class _Verdict:
    allow: list[Policy] = field(default_factory=list)
    deny: list[Policy] = field(default_factory=list)
    missing: set[str] = field(default_factory=set)


def parse_policy(document: str | Mapping[str, Any], source_id: str, source_type: str) -> Policy:
    """A :class:`Policy` from a JSON document (also URL-encoded, as IAM returns them) or a dict."""
    doc: Any = document
    if isinstance(document, str):
        text = document.strip()
        if text.startswith("%7B") or text.startswith("%7b"):
            text = unquote(text)
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise PolicyError(f"policy {source_id} is not valid JSON: {exc}") from exc
    if not isinstance(doc, Mapping) or "Statement" not in doc:
        raise PolicyError(f"policy {source_id} has no Statement")
    raw = doc["Statement"]
    statements = [raw] if isinstance(raw, Mapping) else raw
    if not isinstance(statements, list) or not all(isinstance(s, Mapping) for s in statements):
        raise PolicyError(f"policy {source_id}: Statement must be an object or a list of objects")
    for statement in statements:
        if (effect := statement.get("Effect")) not in ("Allow", "Deny"):
            raise PolicyError(f"policy {source_id}: Effect must be Allow or Deny, not {effect!r}")
    return Policy(source_id, source_type, tuple(statements))


def evaluate(
    policies: Sequence[Policy],
    action: str,
    resource: str = "*",
    *,
    boundary: Sequence[Policy] | None = None,
    context: Mapping[str, Sequence[str]] | None = None,
) -> Evaluation:
    """The decision for ``action`` on ``resource`` under ``policies`` (and ``boundary``, if any)."""
    given = {k.lower(): list(v) for k, v in (context or {}).items()}
    identity = _judge(policies, action, resource, given)
    missing = set(identity.missing)
    allowed_by_boundary: bool | None = None
    decision = IMPLICIT_DENY
    if identity.deny:
        decision = EXPLICIT_DENY
    elif identity.allow:
        decision = ALLOWED
    if boundary is not None:
        limits = _judge(boundary, action, resource, given)
        missing |= limits.missing
        allowed_by_boundary = bool(limits.allow) and not limits.deny
        if limits.deny:
            decision = EXPLICIT_DENY
        elif decision == ALLOWED and not allowed_by_boundary:
            decision = IMPLICIT_DENY
    matched = {EXPLICIT_DENY: identity.deny, ALLOWED: identity.allow}.get(decision, [])
    return Evaluation(action, resource, decision, tuple(matched), tuple(sorted(missing)), allowed_by_boundary)


def _judge(
    policies: Iterable[Policy], action: str, resource: str, context: Mapping[str, list[str]]
) -> _Verdict:
    verdict = _Verdict()
    for policy in policies:
        for statement in policy.statements:
            if not _applies(statement, action, resource):
                continue
            condition = statement.get("Condition")
            if condition:
                holds, missing = _condition_holds(condition, context)
                verdict.missing |= missing
                if not holds:
                    continue
            target = verdict.deny if statement["Effect"] == "Deny" else verdict.allow
            if policy not in target:
                target.append(policy)
    return verdict


def _applies(statement: Mapping[str, Any], action: str, resource: str) -> bool:
    if "NotAction" in statement:
        if _any_match(statement["NotAction"], action, fold_case=True):
            return False
    elif not _any_match(statement.get("Action", []), action, fold_case=True):
        return False
    if "NotResource" in statement:
        return not _any_match(statement["NotResource"], resource, fold_case=False)
    if "Resource" in statement:
        return _any_match(statement["Resource"], resource, fold_case=False)
    return True


def _any_match(patterns: Any, value: str, *, fold_case: bool) -> bool:
    items = [patterns] if isinstance(patterns, str) else list(patterns or [])
    return any(_glob(str(p), fold_case).fullmatch(value) for p in items)


@lru_cache(maxsize=1024)
def _glob(pattern: str, fold_case: bool) -> re.Pattern[str]:
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body, (re.IGNORECASE | re.DOTALL) if fold_case else re.DOTALL)


_STRING_OPERATORS = {
    "StringEquals": (False, False, True),
    "StringNotEquals": (False, True, True),
    "StringEqualsIgnoreCase": (False, False, False),
    "StringNotEqualsIgnoreCase": (False, True, False),
    "StringLike": (True, False, True),
    "StringNotLike": (True, True, True),
    "ArnEquals": (False, False, True),
    "ArnNotEquals": (False, True, True),
    "ArnLike": (True, False, True),
    "ArnNotLike": (True, True, True),
}
"""operator -> (wildcards, negated, case-sensitive)"""


def _condition_holds(condition: Mapping[str, Any], context: Mapping[str, list[str]]) -> tuple[bool, set[str]]:
    """Whether every operator of a ``Condition`` block holds, and the keys it lacked."""
    holds, missing = True, set()
    for raw_operator, tests in condition.items():
        operator = str(raw_operator)
        if_exists = operator.endswith("IfExists")
        base = operator[: -len("IfExists")] if if_exists else operator
        for key, expected in (tests or {}).items():
            values = context.get(str(key).lower())
            if values is None:
                if not if_exists:
                    missing.add(str(key))
                    holds = False
                continue
            if not _operator_holds(base, expected, values):
                holds = False
    return holds, missing


def _operator_holds(operator: str, expected: Any, values: list[str]) -> bool:
    wanted = [str(e) for e in ([expected] if isinstance(expected, str | bool) else list(expected))]
    if operator == "Bool":
        return any(v.lower() == w.lower() for v in values for w in wanted)
    if operator not in _STRING_OPERATORS:
        return False
    wildcards, negated, case_sensitive = _STRING_OPERATORS[operator]

    def same(value: str, pattern: str) -> bool:
        if wildcards:
            return _glob(pattern, not case_sensitive).fullmatch(value) is not None
        return value == pattern if case_sensitive else value.lower() == pattern.lower()

    hit = any(same(v, w) for v in values for w in wanted)
    return not hit if negated else hit
