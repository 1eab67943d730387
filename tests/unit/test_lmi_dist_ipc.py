"""LMI-Dist's frontend-core wire (lmforge.engines.lmi_dist.ipc): every message comes back as it was
sent, typed; a request's sampling settings are a struct the core decodes once; anything else is
refused with an error that names the pipe and the field."""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
from typing import Any

import msgspec
import pytest

from lmforge.engines.lmi_dist import ipc
from lmforge.engines.protocol import SamplingParams, StructuredOutput

FULL = SamplingParams(
    max_new_tokens=9,
    do_sample=True,
    temperature=0.7,
    top_k=40,
    top_p=0.9,
    repetition_penalty=1.2,
    seed=2**63 - 1,
    stop=("x", "yz"),
    top_n=3,
    ignore_eos=True,
    logprobs=False,
    structured=StructuredOutput("json_schema", '{"type":"object"}'),
    min_new_tokens=2,
    presence_penalty=0.5,
    frequency_penalty=-0.25,
    min_p=0.1,
    logit_bias=((5, -2.5), (7, 100.0)),
    stop_token_ids=(11, 4),
    prompt_top_n=2,
)


def test_sampling_carries_every_setting_the_core_reads() -> None:
    """Each SamplingParams field is on the wire or named as the frontend's own: a field added to
    SamplingParams must be placed on one side or the other."""
    params = {f.name for f in dataclasses.fields(SamplingParams)}
    wire = set(ipc.Sampling.__struct_fields__)
    assert wire | ipc.FRONTEND_ONLY == params and not wire & ipc.FRONTEND_ONLY
    sampling = ipc.Sampling.of(FULL)
    for name in wire:
        assert getattr(sampling, name) == getattr(FULL, name), name


def test_sampling_values_take_the_wire_types() -> None:
    sampling = ipc.Sampling.of(SamplingParams(max_new_tokens=3, temperature=2, top_p=1, do_sample=True))
    assert type(sampling.temperature) is float and type(sampling.top_p) is float
    add = ipc.decode_to_core(ipc.encode(ipc.Add("r", [1], sampling)))
    assert isinstance(add, ipc.Add) and add.sampling == sampling


@pytest.mark.parametrize(
    "message",
    [
        ipc.Add("r1#1", [1, 2, 3], ipc.Sampling.of(FULL), lora=4),
        ipc.Add("r2#2", [], ipc.Sampling.of(SamplingParams(max_new_tokens=1))),
        ipc.Cancel("r1#1"),
        ipc.Call(7, ipc.Method.SCORE_PROMPT, {"ids": [1, 2], "top_n": 1, "adapter": 0}),
        ipc.Call(8, ipc.Method.PROFILE_START, {}),
        ipc.Shutdown(),
    ],
)
def test_messages_to_the_core_come_back_as_sent(message: Any) -> None:
    back = ipc.decode_to_core(ipc.encode(message))
    assert type(back) is type(message) and back == message
    if isinstance(back, ipc.Call):
        assert type(back.method) is ipc.Method
    if isinstance(back, ipc.Add):  # typed all the way down: the sampler reads it as it is
        assert isinstance(back.sampling, ipc.Sampling)
        assert back.sampling.structured is None or isinstance(back.sampling.structured, StructuredOutput)
        assert all(type(pair) is tuple for pair in back.sampling.logit_bias)


@pytest.mark.parametrize(
    "message",
    [
        ipc.Outputs([ipc.Out("r1#1", [5, 6], [-0.5, -1.25], [[(5, -0.5)], [(6, -1.25), (2, -3.0)]])]),
        ipc.Outputs([ipc.Out("r1#1", [], [], None, ipc.REJECTED, "no grammar", "structured")]),
        ipc.Reply(3, {"load_ms": 1.5}),
        ipc.Reply(4, None, "bad adapter", "bad_request", "src"),
        ipc.Ready(max_model_len=256, eos_ids=[2], lora_layers={"q_proj": (64, 64)}, pid=123, world=2),
        ipc.Dead("tensor-parallel rank 1 exited with code 9"),
    ],
)
def test_messages_from_the_core_come_back_as_sent(message: Any) -> None:
    back = ipc.decode_from_core(ipc.encode(message))
    assert type(back) is type(message) and back == message


def test_a_nan_log_prob_survives_the_wire() -> None:
    back = ipc.decode_from_core(ipc.encode(ipc.Outputs([ipc.Out("r", [1], [float("nan")])])))
    assert isinstance(back, ipc.Outputs) and math.isnan(back.items[0].logprobs[0])


def test_sampling_pickles_and_copies_for_the_tensor_parallel_ranks() -> None:
    """transformers pickles a new request's state to every rank and deep-copies its kwargs."""
    sampling = ipc.Sampling.of(FULL)
    assert pickle.loads(pickle.dumps(sampling)) == sampling
    assert copy.deepcopy(sampling) == sampling
    assert hash(sampling) == hash(ipc.Sampling.of(FULL))


@pytest.mark.parametrize(
    ("params", "ends"),
    [
        (SamplingParams(max_new_tokens=1), [2, 7]),
        (SamplingParams(max_new_tokens=1, stop_token_ids=(9, 2)), [2, 7, 9, 2]),
        (SamplingParams(max_new_tokens=1, ignore_eos=True), []),
        (SamplingParams(max_new_tokens=1, ignore_eos=True, stop_token_ids=(9,)), [9]),
    ],
)
def test_end_ids_are_eos_unless_ignored_then_the_stop_token_ids(
    params: SamplingParams, ends: list[int]
) -> None:
    assert ipc.Sampling.of(params).end_ids([7, 2, 7]) == ends


def _add_with(field: str, value: Any) -> bytes:
    """An Add whose sampling settings have ``value`` at ``field`` (encoded without any type check)."""
    fields = list(ipc.Sampling.__struct_fields__)
    raw = list(msgspec.msgpack.decode(ipc.encode(ipc.Sampling.of(FULL))))
    raw[fields.index(field)] = value
    return msgspec.msgpack.encode(["add", "r1", [1, 2], raw, 0])


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (_add_with("temperature", "hot"), "Expected `float`, got `str` - at `$[3][2]`"),
        (_add_with("logit_bias", [[5, "x"]]), "Expected `float`, got `str` - at `$[3][9][0][1]`"),
        (_add_with("structured", {"kind": 3}), "Expected `str`, got `int` - at `$[3][15].kind`"),
        (msgspec.msgpack.encode(["add", "r1", [1, 2]]), "Expected `array` of at least length 4"),
        (msgspec.msgpack.encode(["call", 1, "stats", {}]), "Invalid enum value 'stats' - at `$[2]`"),
        (msgspec.msgpack.encode(["ready", 256, [2], {}, 1]), "Invalid value 'ready' - at `$[0]`"),
        (b"\xc1", "invalid"),
    ],
)
def test_a_malformed_message_to_the_core_names_the_pipe_and_the_field(raw: bytes, needle: str) -> None:
    with pytest.raises(ipc.MalformedMessage) as caught:
        ipc.decode_to_core(raw)
    text = str(caught.value)
    assert text.startswith("a malformed message from the frontend: ")
    assert needle.lower() in text.lower(), text


def test_a_malformed_message_from_the_core_names_the_pipe() -> None:
    with pytest.raises(ipc.MalformedMessage, match=r"^a malformed message from the engine core: .*\$\[1\]"):
        ipc.decode_from_core(msgspec.msgpack.encode(["dead", 5]))


def test_the_core_answers_a_malformed_message_with_dead_and_exits_1() -> None:
    """It cannot tell whose request it was: every stream must learn why the core stopped."""
    import os
    from types import SimpleNamespace

    import zmq

    from lmforge.config import ServingConfig
    from lmforge.engines.lmi_dist.core import Core

    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    try:
        pull.bind("inproc://malformed")
        push.connect("inproc://malformed")
        push.send(msgspec.msgpack.encode(["cancel", 5]))
        sent: list[Any] = []
        core = Core(ServingConfig(), SimpleNamespace(send=lambda raw, copy: sent.append(raw)))
        assert core.serve(pull, os.getppid()) == 1
    finally:
        pull.close(linger=0)
        push.close(linger=0)
        context.term()
    [dead] = [ipc.decode_from_core(raw) for raw in sent]
    assert isinstance(dead, ipc.Dead)
    assert dead.reason.startswith("a malformed message from the frontend: ") and "$[1]" in dead.reason


def test_the_frontend_takes_a_malformed_message_for_the_cores_death() -> None:
    """Its reader must not die silently, leaving every stream waiting."""
    import asyncio
    import shutil
    from types import SimpleNamespace

    from lmforge.config import ServingConfig
    from lmforge.engines.lmi_dist.client import CoreProcess

    deaths: list[str] = []
    core = CoreProcess(ServingConfig(), lambda items: None, deaths.append)
    shutil.rmtree(core._folder)

    async def recv(copy: bool) -> Any:
        return SimpleNamespace(buffer=msgspec.msgpack.encode(["outputs", [["r1", [1], ["x"]]]]))

    core._pull = SimpleNamespace(recv=recv)
    asyncio.run(asyncio.wait_for(core._receive(), 10))
    assert core.dead is not None and core.dead.startswith("a malformed message from the engine core: ")
    assert deaths == [core.dead]
