"""What a completion request to `hanlm serve` may ask, checked before the engine sees it.

Every request the server cannot take gets a 4xx with OpenAI's error body (`error`: `message`,
`type`, `param`, `code`) instead of reaching the engine, which would answer some of them with a
traceback and a 500: a body that is not a JSON object, invalid UTF-8, NaN, wrong types, an
unknown model or parameter, empty or malformed messages, unknown roles, sampling settings out of
range, too many or too long stop strings, a huge logit_bias, more answers than the engine gives.
The size limits are the [serve] section's (hanlm.config.ServeSection)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

INVALID = "invalid_request_error"


@dataclass
class RequestError(Exception):
    """A request refused: its HTTP status and OpenAI's error fields."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    type: str = INVALID

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class Limits:
    """What one request may ask: the [serve] settings and what the model and engine allow."""

    model: str  # the name clients give (`/v1/models`)
    context: int  # tokens of prompt and answer together
    vocab_size: int
    max_n: int  # answers one request may ask for (llama-cpp-python's server gives one)
    # the [serve] caps (hanlm.config.ServeSection holds their defaults)
    max_messages: int
    max_message_chars: int
    max_total_chars: int
    max_stop: int
    max_stop_chars: int
    max_logit_bias: int


Number = Annotated[float, Field(allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Message(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str
    name: str | None = Field(None, max_length=64)


class StreamOptions(_Strict):
    include_usage: StrictBool = False


class _Sampling(_Strict):
    """The fields both completion routes take: OpenAI's, and the engines' own sampling fields
    (which hanlm's defaults fill in from [generate])."""

    model: str | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    n: StrictInt = Field(1, ge=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    temperature: Number = Field(1.0, ge=0, le=2)
    top_p: Number = Field(1.0, gt=0, le=1)
    top_k: StrictInt = Field(0, ge=-1)
    min_p: Number = Field(0.0, ge=0, le=1)
    presence_penalty: Number = Field(0.0, ge=-2, le=2)
    frequency_penalty: Number = Field(0.0, ge=-2, le=2)
    repeat_penalty: Number = Field(1.0, gt=0, le=10)  # llama.cpp's spelling
    repetition_penalty: Number = Field(1.0, gt=0, le=10)  # vLLM's
    min_tokens: StrictInt = Field(0, ge=0)
    seed: StrictInt | None = Field(None, ge=-1, le=2**32 - 1)
    logit_bias: dict[str, Number] | None = None
    logprobs: StrictBool | StrictInt | None = None
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    user: str | None = Field(None, max_length=256)


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)


class CompletionRequest(_Sampling):
    prompt: str
    echo: StrictBool = False


CHAT, COMPLETION = "/v1/chat/completions", "/v1/completions"
ROUTES = {CHAT: ChatRequest, COMPLETION: CompletionRequest}


def parse(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a RequestError saying why it is not one."""
    if not body.strip():
        raise RequestError(400, "the request body is empty: send a JSON object", code="empty_body")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(
            400, f"the request body is not valid UTF-8 (byte {e.start})", code="invalid_utf8"
        ) from None
    try:
        value = json.loads(text, parse_constant=_no_constants)
    except RecursionError:
        raise RequestError(400, "the request body nests too deeply", code="invalid_json") from None
    except ValueError as e:
        raise RequestError(
            400, f"the request body is not valid JSON: {e}", code="invalid_json"
        ) from None
    if not isinstance(value, dict):
        raise RequestError(
            400, f"the request body must be a JSON object, not {_kind(value)}", code="invalid_json"
        )
    return value


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


def check(path: str, request: dict[str, Any], limits: Limits) -> BaseModel:
    """The request to `path` checked against its schema and `limits`; a RequestError otherwise."""
    try:
        checked = ROUTES[path].model_validate(request)
    except ValidationError as e:
        raise _from_validation(e) from None
    except RecursionError:
        raise RequestError(400, "the request nests too deeply", code="invalid_json") from None
    if checked.model is not None and checked.model != limits.model:
        raise RequestError(
            404,
            f"the model {checked.model!r} does not exist here: this server serves {limits.model!r}",
            param="model",
            code="model_not_found",
        )
    if checked.n > limits.max_n:
        raise RequestError(
            400, f"n is {checked.n}, and this engine gives at most {limits.max_n} answer(s) "
            "per request", param="n", code="invalid_value",
        )  # fmt: skip
    answer = _answer_tokens(checked)
    if answer is not None and answer > limits.context:
        raise RequestError(
            400, f"max_tokens is {answer}, more than the model's context of {limits.context} "
            "tokens", param="max_tokens", code="invalid_value",
        )  # fmt: skip
    _check_stop(checked.stop, limits)
    _check_logit_bias(checked.logit_bias, limits)
    if isinstance(checked, ChatRequest):
        _check_messages(checked.messages, limits)
    elif len(checked.prompt) > limits.max_total_chars:
        raise RequestError(
            400, f"the prompt has {len(checked.prompt):,} characters; at most "
            f"{limits.max_total_chars:,} are taken", param="prompt", code="too_long",
        )  # fmt: skip
    if checked.stream_options is not None and not checked.stream:
        raise RequestError(
            400, "stream_options is only allowed with stream: true", param="stream_options"
        )
    return checked


def _answer_tokens(checked: BaseModel) -> int | None:
    return getattr(checked, "max_completion_tokens", None) or checked.max_tokens


def _check_messages(messages: list[Message], limits: Limits) -> None:
    if len(messages) > limits.max_messages:
        raise RequestError(
            400, f"the request has {len(messages)} messages; at most {limits.max_messages} are "
            "taken", param="messages", code="too_many_messages",
        )  # fmt: skip
    total = 0
    for i, message in enumerate(messages):
        if len(message.content) > limits.max_message_chars:
            raise RequestError(
                400, f"message {i} has {len(message.content):,} characters; at most "
                f"{limits.max_message_chars:,} are taken", param=f"messages[{i}].content",
                code="too_long",
            )  # fmt: skip
        total += len(message.content)
    if total > limits.max_total_chars:
        raise RequestError(
            400, f"the messages have {total:,} characters together; at most "
            f"{limits.max_total_chars:,} are taken", param="messages", code="too_long",
        )  # fmt: skip


def _check_stop(stop: str | list[str] | None, limits: Limits) -> None:
    strings = [stop] if isinstance(stop, str) else list(stop or [])
    if len(strings) > limits.max_stop:
        raise RequestError(
            400, f"stop has {len(strings)} strings; at most {limits.max_stop} are taken",
            param="stop", code="invalid_value",
        )  # fmt: skip
    for i, text in enumerate(strings):
        if not text or len(text) > limits.max_stop_chars:
            raise RequestError(
                400, f"stop string {i} has {len(text)} characters; 1 to {limits.max_stop_chars} "
                "are taken", param="stop", code="invalid_value",
            )  # fmt: skip


def _check_logit_bias(bias: dict[str, float] | None, limits: Limits) -> None:
    if not bias:
        return
    if len(bias) > limits.max_logit_bias:
        raise RequestError(
            400, f"logit_bias has {len(bias):,} entries; at most {limits.max_logit_bias} are "
            "taken", param="logit_bias", code="invalid_value",
        )  # fmt: skip
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and int(key) < limits.vocab_size):
            raise RequestError(
                400, f"logit_bias key {key[:32]!r} is not a token id (0 to "
                f"{limits.vocab_size - 1})", param="logit_bias", code="invalid_value",
            )  # fmt: skip
        if not -100 <= value <= 100:
            raise RequestError(
                400, f"logit_bias of token {key} is {value}; -100 to 100 are taken",
                param="logit_bias", code="invalid_value",
            )  # fmt: skip


def _from_validation(error: ValidationError) -> RequestError:
    """The first problem pydantic found, in OpenAI's words."""
    first = error.errors(include_url=False)[0]
    param = _param(first["loc"])
    kind = first["type"]
    if kind == "extra_forbidden":
        if param and "." not in param and "[" not in param:
            message = f"unrecognized request argument supplied: {param}"
        else:
            message = f"{param} is not a field hanlm serve takes"
        return RequestError(400, message, param=param, code="unknown_parameter")
    if kind == "too_short":
        return RequestError(400, f"{param} is empty: give at least one", param=param,
                            code="invalid_value")  # fmt: skip
    if kind == "missing":
        return RequestError(400, f"{param} is required", param=param, code="missing_required")
    if kind == "literal_error" and param.endswith(".role"):
        return RequestError(
            400, f"{param} is {first['input']!r}: roles are system, user and assistant",
            param=param, code="invalid_value",
        )  # fmt: skip
    shown = first["input"]
    shown = _kind(shown) if isinstance(shown, (dict, list)) else repr(shown)[:64]
    if isinstance(first["input"], float) and not math.isfinite(first["input"]):
        shown = str(first["input"])
    return RequestError(
        400, f"{param or 'the request'}: {first['msg'].lower()} (got {shown})", param=param or None,
        code="invalid_type" if kind.endswith("_type") else "invalid_value",
    )  # fmt: skip


def _param(loc: tuple) -> str:
    """pydantic's location as OpenAI names a parameter: `messages[0].content`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "list[str]", "int", "bool", "float"):  # a union's branch
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")  # fmt: skip
