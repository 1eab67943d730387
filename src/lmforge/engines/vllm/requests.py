"""lmforge's requests as vLLM takes them, and vLLM's outputs as lmforge's events.

* settings: :func:`sampling_params` (vLLM's own limits become 400s naming lmforge's field, :data:`FIELD`);
* prompts: :func:`engine_input`, rendered as vLLM's own server renders them;
* outputs: :func:`events_of`, each delta's token ids through the request's
  :class:`~lmforge.engines.streaming.TokenStream` (text and stop strings are lmforge's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmforge.engines.protocol import FieldError, FinishReason, RequestField, Token

if TYPE_CHECKING:
    from lmforge.engines.protocol import GenerationEvent, SamplingParams
    from lmforge.engines.streaming import TokenStream

F = RequestField
#: the parameter a vLLM refusal names (``VLLMValidationError.parameter``: vLLM's SamplingParams names,
#: ``prompt``) -> lmforge's request field
FIELD = {
    "max_tokens": F.MAX_NEW_TOKENS,
    "min_tokens": F.MIN_NEW_TOKENS,
    "temperature": F.TEMPERATURE,
    "top_k": F.TOP_K,
    "top_p": F.TOP_P,
    "min_p": F.MIN_P,
    "repetition_penalty": F.REPETITION_PENALTY,
    "presence_penalty": F.PRESENCE_PENALTY,
    "frequency_penalty": F.FREQUENCY_PENALTY,
    "seed": F.SEED,
    "logprobs": F.TOP_N,
    "prompt_logprobs": F.PROMPT_TOP_N,
    "logit_bias": F.LOGIT_BIAS,
    "stop_token_ids": F.STOP_TOKEN_IDS,
    "structured_outputs": F.STRUCTURED,
    "prompt": F.PROMPT,
}


def sampling_params(params: SamplingParams) -> Any:
    """vLLM's SamplingParams; vLLM's own limits become 400s naming the LMI field."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    sampled = params.do_sample
    structured = None
    if params.structured is not None:
        from lmforge.engines.structured import schema_text

        # vLLM's own structured outputs, xgrammar and compact JSON as on LMI-Dist (engine_kwargs)
        structured = StructuredOutputsParams(json=schema_text(params.structured))
    try:
        return VllmSamplingParams(
            max_tokens=params.max_new_tokens,
            temperature=params.temperature if sampled else 0.0,
            top_k=params.top_k if sampled else 0,
            top_p=params.top_p if sampled else 1.0,
            repetition_penalty=params.repetition_penalty,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            min_p=params.min_p if sampled else 0.0,
            min_tokens=params.min_new_tokens,
            logit_bias=dict(params.logit_bias) or None,
            stop_token_ids=list(params.stop_token_ids) or None,
            seed=params.seed,
            ignore_eos=params.ignore_eos,
            # only when the answer carries them: vLLM's log-prob path costs ~40 % of the
            # frontend's CPU per token (bench/frontend_overhead.py)
            logprobs=params.top_n if params.logprobs else None,
            prompt_logprobs=params.prompt_top_n,
            output_kind=RequestOutputKind.DELTA,
            structured_outputs=structured,
            # stop strings and text are lmforge's (as for LMI-Dist): every token gets its own text
            detokenize=False,
        )
    except (VLLMValidationError, ValueError) as exc:
        field = FIELD.get(str(getattr(exc, "parameter", None)), F.PARAMS)
        raise FieldError(field, f"vLLM refuses this request: {exc}") from None


def refusal(exc: Exception, params: SamplingParams) -> FieldError:
    """vLLM's refusal of a request (its checks of the prompt, the settings, a schema) as a FieldError
    naming lmforge's field."""
    fallback = F.STRUCTURED if params.structured is not None else F.PROMPT
    return FieldError(FIELD.get(str(getattr(exc, "parameter", None)), fallback), str(exc))


def engine_input(llm: Any, prompt_ids: list[int]) -> Any:
    """The prompt as vLLM's renderer makes it for ``AsyncLLM.generate`` (``Renderer.render_cmpl``, the
    path vLLM's docstring gives), made here on the event loop: token ids need no tokenizing, and a raw
    ``{"prompt_token_ids": ...}`` makes ``AsyncLLM`` do the same rendering in a worker thread of its
    renderer (a thread hop there and back for every request, ~0.1-1 ms of TTFT on a busy machine).
    The raw prompt where this vLLM has no such renderer."""
    renderer = getattr(llm, "renderer", None)
    raw = {"prompt_token_ids": list(prompt_ids)}  # vLLM keeps it (and may extend it): its own copy
    if renderer is None or not hasattr(renderer, "render_cmpl"):
        return raw
    try:
        from vllm.renderers.inputs.preprocess import parse_model_prompt
    except ImportError:
        return raw
    parsed = parse_model_prompt(llm.model_config, raw)
    (engine_input,) = renderer.render_cmpl([parsed], renderer.default_cmpl_tok_params)
    return engine_input


def events_of(
    output: Any, params: SamplingParams, stream: TokenStream, eos_ids: set[int]
) -> list[GenerationEvent]:
    """The events of one vLLM output (a delta of new token ids) for the request's ``stream``."""
    completion = output.outputs[0]
    logprobs = completion.logprobs or []
    tokens = []
    for i, tid in enumerate(completion.token_ids):
        position = logprobs[i] if i < len(logprobs) else {}
        entry = position.get(tid) if position else None
        top = None
        if params.top_n and position:
            ranked = sorted(position.items(), key=lambda kv: (kv[1].rank or 0, -kv[1].logprob))
            top = [(t, lp.logprob) for t, lp in ranked[: params.top_n]]
        log_prob = float(entry.logprob) if entry is not None else float("nan")
        tokens.append(Token(tid, "", log_prob, special=tid in eos_ids, top_logprobs=top))
    done = finish_reason(completion) if output.finished else None
    return stream.step(tokens, done, f"finish_reason={completion.finish_reason!r}")


def finish_reason(completion: Any) -> FinishReason:
    """lmforge's finish reason for vLLM's (a stop string told apart from EOS)."""
    reason = completion.finish_reason
    if reason == "length":
        return FinishReason.LENGTH
    if reason == "stop":
        return FinishReason.STOP_SEQUENCE if isinstance(completion.stop_reason, str) else FinishReason.EOS
    if reason == "abort":
        return FinishReason.ABORT
    return FinishReason.ERROR
