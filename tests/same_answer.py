"""The differential harness: the same request gives the same answer alone or in a crowd.

Every :class:`Probe` (a route, a body, streamed or not) is sent one at a time, then all of them at once
in a shuffled order (twice, each round in another order), and each crowd answer must equal its alone
answer: the same token texts/ids, the same finish reason and text, and every log-prob (generated,
alternatives, prompt) within :data:`TOL`. Answers are reduced to one shape per route first
(:func:`reduce`), so a stream that groups its tokens into other chunks under load still compares.

The probes cover every per-request value an engine computes inside a shared batch: prompt log-probs
with ``echo`` (lm-eval-harness's log-likelihood requests), generated log-probs with alternatives on
the three routes, seeded sampling, repetition/presence/frequency penalties, structured output,
batched prompts (a list of prompts, with ``n``), and (where the server has adapters) LoRA;
prompts of different lengths share each step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

#: alone and in a crowd, fp32 on one CPU thread: the batch changes the order of the sums only
TOL = 1e-4

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
LMI = "/invocations"


@dataclass(frozen=True)
class Probe:
    name: str
    path: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


Answer = dict[str, Any]
"""One reply reduced: ``text``, ``finish``, ``tokens`` (text or id), ``logprobs``, ``top`` (per
token: sorted (token, log-prob) pairs) and, with ``echo``, the prompt's part of those."""


# --------------------------------------------------------------------------- probes


def echo_probe(name: str, prompt: str, max_tokens: int = 1, **extra: Any) -> Probe:
    """lm-eval-harness's log-likelihood request: the prompt scored, with (or without) a token after."""
    body = {"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": max_tokens, "temperature": 0}
    return Probe(name, COMPLETIONS, {**body, **extra})


def standard_probes(prompts: Sequence[str], *, adapter: str | None = None) -> list[Probe]:
    """The probes every engine must answer alike alone and in a crowd (``prompts``: at least 4, of
    different lengths); with ``adapter``, each names that LoRA adapter (OpenAI's ``model``, LMI's
    ``adapters``) and its name starts with the adapter's."""
    named = {"model": adapter} if adapter else {}
    probes = _probes(list(prompts), named)
    if adapter is None:
        return probes
    return [
        dataclasses.replace(
            p,
            name=f"{adapter}-{p.name}",
            body={**p.body, "adapters": adapter} if p.path == LMI else p.body,
        )
        for p in probes
    ]


def _probes(p: list[str], named: dict[str, str]) -> list[Probe]:
    chat = [{"role": "user", "content": p[1]}]
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    greedy = {"temperature": 0, **named}
    return [
        *(echo_probe(f"echo-{i}", prompt, **named) for i, prompt in enumerate(p)),
        echo_probe("echo-only", p[2], max_tokens=0, logprobs=2, **named),
        echo_probe("echo-streamed", p[3], max_tokens=4, stream=True, **named),
        Probe("completion", COMPLETIONS, {"prompt": p[0], "max_tokens": 8, "logprobs": 2, **greedy}),
        Probe(
            "completion-streamed",
            COMPLETIONS,
            {"prompt": p[2], "max_tokens": 8, "logprobs": 2, "stream": True, **greedy},
        ),
        Probe(
            "completion-seeded",
            COMPLETIONS,
            {"prompt": p[1], "max_tokens": 8, "logprobs": 1, "temperature": 0.9, "seed": 11, **named},
        ),
        Probe(
            "completion-penalties",
            COMPLETIONS,
            {
                "prompt": p[3],
                "max_tokens": 8,
                "logprobs": 1,
                "presence_penalty": 0.8,
                "frequency_penalty": 0.5,
                **greedy,
            },
        ),
        Probe(
            "chat",
            CHAT,
            {"messages": chat, "max_tokens": 8, "logprobs": True, "top_logprobs": 2, **greedy},
        ),
        Probe(
            "chat-streamed",
            CHAT,
            {
                "messages": [{"role": "user", "content": p[0]}],
                "max_tokens": 8,
                "logprobs": True,
                "top_logprobs": 2,
                "stream": True,
                **greedy,
            },
        ),
        Probe(
            "chat-structured",
            CHAT,
            {
                "messages": [{"role": "user", "content": "Describe a person as JSON."}],
                "max_tokens": 16,
                "logprobs": True,
                "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
                **greedy,
            },
        ),
        Probe(
            "batched-echo",
            COMPLETIONS,
            {"prompt": [p[1], p[0], p[3]], "echo": True, "logprobs": 1, "max_tokens": 2, **greedy},
        ),
        Probe(
            "batched-seeded-streamed",
            COMPLETIONS,
            {
                "prompt": [p[2], p[0]],
                "n": 2,
                "max_tokens": 6,
                "logprobs": 1,
                "temperature": 0.8,
                "seed": 3,
                "stream": True,
                **named,
            },
        ),
        Probe("lmi", LMI, _lmi(p[3], {"top_n_tokens": 2})),
        Probe("lmi-streamed", LMI, {**_lmi(p[1], {"top_n_tokens": 2}), "stream": True}),
        Probe("lmi-repetition", LMI, _lmi(p[0], {"repetition_penalty": 1.3})),
        Probe("lmi-sampled", LMI, _lmi(p[2], {"do_sample": True, "temperature": 0.8, "seed": 5})),
    ]


def _lmi(prompt: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"inputs": prompt, "parameters": {"max_new_tokens": 8, "details": True, **parameters}}


# --------------------------------------------------------------------------- reducing answers


def reduce(probe: Probe, resp: httpx.Response) -> Answer:
    assert resp.status_code == 200, f"{probe.name}: {resp.status_code} {resp.text[:500]}"
    if probe.path == LMI:
        if probe.stream:
            return _lmi_stream([json.loads(x) for x in resp.text.splitlines() if x.strip()])
        return _lmi_reply(resp.json())
    if not probe.stream:
        return _openai(probe.path, [resp.json()])
    events = resp.text.split("\n\n")
    chunks = [json.loads(e[len("data: ") :]) for e in events if e.startswith("data: {")]
    return _openai(probe.path, chunks)


def _pairs(items: Iterable[dict[str, Any]], key: str, value: str) -> list[tuple[Any, float]]:
    return sorted((item[key], item[value]) for item in items)


def _lmi_reply(body: dict[str, Any]) -> Answer:
    details = body["details"]
    tokens = details["tokens"]
    top = details.get("top_tokens") or []
    return {
        "text": body["generated_text"],
        "finish": details["finish_reason"],
        "tokens": [t["id"] for t in tokens],
        "logprobs": [t["log_prob"] for t in tokens],
        "top": [_pairs(step, "id", "log_prob") for step in top],
    }


def _lmi_stream(lines: list[dict[str, Any]]) -> Answer:
    last = lines[-1]
    return {
        "text": last["generated_text"],
        "finish": (last.get("details") or {}).get("finish_reason"),
        "tokens": [line["token"]["id"] for line in lines],
        "logprobs": [line["token"]["log_prob"] for line in lines],
        "top": [_pairs(line.get("top_tokens") or [], "id", "log_prob") for line in lines],
    }


def _openai(path: str, chunks: list[dict[str, Any]]) -> Answer:
    """Completions or chat, one reply or a stream's chunks: every choice's parts joined, by index."""
    answers: dict[int, Answer] = {}
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            out = answers.setdefault(
                choice["index"], {"text": "", "finish": None, "tokens": [], "logprobs": [], "top": []}
            )
            if path == CHAT:
                part = choice.get("message") or choice.get("delta") or {}
                out["text"] += part.get("content") or ""
                for entry in (choice.get("logprobs") or {}).get("content") or []:
                    out["tokens"].append(entry["token"])
                    out["logprobs"].append(entry["logprob"])
                    out["top"].append(_pairs(entry.get("top_logprobs") or [], "token", "logprob"))
            else:
                out["text"] += choice.get("text") or ""
                logprobs = choice.get("logprobs") or {}
                out["tokens"] += logprobs.get("tokens") or []
                out["logprobs"] += logprobs.get("token_logprobs") or []
                out["top"] += [sorted((t or {}).items()) for t in logprobs.get("top_logprobs") or []]
            out["finish"] = choice.get("finish_reason") or out["finish"]
    assert answers, f"no choices in {chunks[:2]}"
    if len(answers) == 1:
        return answers[0]
    return {"choices": [answers[i] for i in sorted(answers)]}


# --------------------------------------------------------------------------- comparing


def differences(a: Any, b: Any, tol: float = TOL, where: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ: strings, ids and None exactly, floats within ``tol``."""
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            return [f"{where}: {a!r} != {b!r}"]
        if math.isnan(a) and math.isnan(b):
            return []
        return [] if abs(a - b) <= tol else [f"{where}: {a!r} vs {b!r} (|d| {abs(a - b):.2e})"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in differences(a[k], b[k], tol, f"{where}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items != {len(b)}: {a!r} vs {b!r}"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, tol, f"{where}[{i}]")
        ]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


async def _send(client: httpx.AsyncClient, url: str, probe: Probe) -> Answer:
    resp = await client.post(url + probe.path, json=probe.body, headers=probe.headers)
    return reduce(probe, resp)


async def _alone_then_crowds(
    url: str, probes: list[Probe], rounds: int, seed: int
) -> tuple[list[Answer], list[list[Answer]]]:
    limits = httpx.Limits(max_connections=len(probes) + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        alone = [await _send(client, url, p) for p in probes]
        crowds = []
        rng = random.Random(seed)
        for _ in range(rounds):
            order = list(range(len(probes)))
            rng.shuffle(order)
            got = await asyncio.gather(*(_send(client, url, probes[i]) for i in order))
            answers: list[Answer] = [{}] * len(probes)
            for i, answer in zip(order, got, strict=True):
                answers[i] = answer
            crowds.append(answers)
    return alone, crowds


def same_alone_and_in_a_crowd(
    url: str, probes: list[Probe], *, rounds: int = 2, seed: int = 0, tol: float = TOL
) -> dict[str, Answer]:
    """Send ``probes`` alone, then ``rounds`` times all at once (shuffled); assert every crowd answer
    equals the alone one. Returns the alone answers by probe name."""
    names = [p.name for p in probes]
    assert len(set(names)) == len(names), "probe names must be unique"
    alone, crowds = asyncio.run(_alone_then_crowds(url, probes, rounds, seed))
    problems = []
    for r, crowd in enumerate(crowds):
        for probe, one, many in zip(probes, alone, crowd, strict=True):
            problems += [f"round {r} {probe.name}{d}" for d in differences(one, many, tol)]
    assert not problems, "answers changed in a crowd:\n" + "\n".join(problems[:40])
    return dict(zip(names, alone, strict=True))


def same_with_adapters_in_a_crowd(url: str, prompts: Sequence[str], peft: Any, *, tol: float = TOL) -> None:
    """:func:`standard_probes` for the base model and adapters ``a1`` and ``a2`` (its echo probes) in one
    crowd, each the same as alone (log-probs within ``tol``); each echo probe's prompt log-probs equal
    ``peft``'s forward pass with the same adapter (:class:`lmforge.testing.lora.PeftReference`, within
    1e-3), so the scorer applies the request's adapter."""
    probes = [*standard_probes(prompts), *standard_probes(prompts, adapter="a1")]
    probes += [p for p in standard_probes(prompts, adapter="a2") if "echo" in p.name]
    answers = same_alone_and_in_a_crowd(url, probes, rounds=1, tol=tol)
    assert answers["echo-1"]["logprobs"] != answers["a1-echo-1"]["logprobs"], "a1 changed nothing"
    assert answers["a1-echo-1"]["logprobs"] != answers["a2-echo-1"]["logprobs"], "a1 and a2 scored alike"
    for i, prompt in enumerate(prompts[:4]):
        for adapter in (None, "a1", "a2"):
            want = peft.prompt_logprobs(prompt, adapter)
            got = answers[f"{adapter}-echo-{i}" if adapter else f"echo-{i}"]["logprobs"][1 : 1 + len(want)]
            worst = max(abs(g - w) for g, w in zip(got, want, strict=True))
            assert worst <= 1e-3, (adapter, prompt, got, want)


def prompt_logprobs(answer: Answer, prompt_len: int) -> list[float | None]:
    """The prompt's part of an ``echo`` answer's log-probs (the first is None: nothing before it)."""
    return list(answer["logprobs"][:prompt_len])


# --------------------------------------------------------------------------- speculation on vs off

#: a flip of the greedy token where the top two log-probs were this close is a near-tie, not a bug: a
#: verify pass computes the same logits with other matmul shapes
NEAR_TIE = 1e-4


def speculation_probes(prompts: Sequence[str]) -> list[Probe]:
    """Greedy probes whose answers copy from their prompts (what n-gram prompt lookup proposes for), with
    the top-2 log-probs that tell a near-tie from a wrong token; plus, from ``prompts``, plain greedy
    ones that propose little."""
    code = (
        "Repeat this code exactly:\n\ndef merge(a, b):\n    out = []\n    i = j = 0\n"
        "    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i])\n"
        "            i += 1\n        else:\n            out.append(b[j])\n            j += 1\n"
        "    return out + a[i:] + b[j:]\n"
    )
    quote = "Say it again: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over"
    top2 = {"logprobs": True, "top_logprobs": 2, "temperature": 0}
    return [
        Probe(
            "spec-chat-code",
            CHAT,
            {"messages": [{"role": "user", "content": code}], "max_tokens": 64, **top2},
        ),
        Probe(
            "spec-chat-code-streamed",
            CHAT,
            {"messages": [{"role": "user", "content": code}], "max_tokens": 48, "stream": True, **top2},
        ),
        Probe(
            "spec-completion-quote",
            COMPLETIONS,
            {"prompt": quote, "max_tokens": 40, "logprobs": 2, "temperature": 0},
        ),
        Probe(
            "spec-lmi-code-stop",
            LMI,
            _lmi(code, {"max_new_tokens": 60, "top_n_tokens": 2, "stop": ["return"]}),
        ),
        Probe(
            "spec-lmi-code-penalties",
            LMI,
            _lmi(
                code,
                {"max_new_tokens": 40, "top_n_tokens": 2, "repetition_penalty": 1.1},
            ),
        ),
        Probe(
            "spec-completion-quote-presence",
            COMPLETIONS,
            {
                "prompt": quote,
                "max_tokens": 30,
                "logprobs": 2,
                "temperature": 0,
                "presence_penalty": 0.2,
                "min_tokens": 25,
            },
        ),
        *(
            Probe(
                f"spec-plain-{i}",
                COMPLETIONS,
                {"prompt": p, "max_tokens": 24, "logprobs": 2, "temperature": 0},
            )
            for i, p in enumerate(prompts[:3])
        ),
    ]


def _first_flip(off: Answer, on: Answer) -> int | None:
    tokens_off, tokens_on = off.get("tokens", []), on.get("tokens", [])
    for i, (a, b) in enumerate(zip(tokens_off, tokens_on, strict=False)):
        if a != b:
            return i
    return None if len(tokens_off) == len(tokens_on) else min(len(tokens_off), len(tokens_on))


def _gap(answer: Answer, i: int) -> float | None:
    """The top-two log-prob gap at token ``i`` (from the answer's top-2 alternatives), if known."""
    top = answer.get("top") or []
    if i >= len(top) or len(top[i]) < 2:
        return None
    values = sorted((lp for _, lp in top[i]), reverse=True)
    return values[0] - values[1]


def answers_alone(url: str, probes: list[Probe]) -> list[Answer]:
    """Each of ``probes`` sent alone, one after another, to ``url``: the answers in order."""
    return asyncio.run(_alone_then_crowds(url, probes, 0, 0))[0]


def same_with_speculation(
    off: str | list[Answer], url_on: str, probes: list[Probe], *, tol: float = TOL, rounds: int = 2
) -> tuple[dict[str, Answer], list[str]]:
    """Each probe's answer with speculation on (``url_on``, alone and in ``rounds`` crowds of all the
    probes) equals its answer with it off (``off``: a URL to send each probe alone to, or those answers
    already, from :func:`answers_alone`): the same tokens and text, log-probs within ``tol``.
    A probe whose tokens part where the top two log-probs were within :data:`NEAR_TIE` is reported by
    name in the returned near-ties (its later tokens cannot compare), never dropped silently; any other
    difference fails. Returns the answers with speculation on sent alone, by name, and the near-ties."""
    want_all = answers_alone(off, probes) if isinstance(off, str) else off
    on = same_alone_and_in_a_crowd(url_on, probes, rounds=rounds, seed=1, tol=tol)
    problems: list[str] = []
    near_ties: list[str] = []
    for probe, want in zip(probes, want_all, strict=True):
        got = on[probe.name]
        flip = _first_flip(want, got)
        if flip is not None:
            gap = _gap(want, flip)
            if gap is not None and gap <= NEAR_TIE:
                near_ties.append(f"{probe.name}: token {flip} flipped at a near-tie (top-2 gap {gap:.1e})")
                continue
        problems += [f"{probe.name}{d}" for d in differences(want, got, tol)]
    assert not problems, "speculation changed answers:\n" + "\n".join(problems[:40])
    return on, near_ties
