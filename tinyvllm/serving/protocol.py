"""The bodies of OpenAI's API (and vLLM's extensions to it) as pydantic models.

Requests reject what they do not understand: an unknown field is a 400 naming it (vLLM instead ignores
unknown fields with a warning in its log; here a setting the client believes it made is never dropped
silently). Fields OpenAI defines that tinyvllm does not implement (n, best_of, penalties, logit_bias,
suffix) are accepted at their no-op values and rejected otherwise. Sampling fields left out take the
model's generation_config.json values, then OpenAI's defaults, as vLLM does.
"""
from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator
from pydantic import Strict as StrictType

MAX_TOP_LOGPROBS = 20

# Numbers in request bodies are strict, as docs/serving.md promises: "8" or true for an integer is a 400 naming
# the field (pydantic's lax mode would turn them into 8 and 1). A number may be given as an integer (1 for 1.0),
# as JSON does not tell them apart.
Int = Annotated[int, StrictType()]
Number = Annotated[float, StrictType()]


def _omitted_if_none(default=None):
    """A response field that only some requests ask for (vLLM's extensions): left out of the JSON when unset."""
    return Field(default, exclude_if=lambda v: v is None)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SamplingFields(Strict):
    """The sampling fields every generation request takes (vLLM's names; top_k, min_tokens, stop_token_ids
    and ignore_eos are vLLM extensions, sent by the openai client through extra_body)."""
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: Int | None = None
    seed: Int | None = None
    min_tokens: Int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[Int] | None = None
    ignore_eos: bool = False


def _must_be(value, allowed, message: str):
    if value not in allowed:
        raise ValueError(message)
    return value


class StreamOptions(Strict):
    include_usage: bool = False


class GenerationRequest(SamplingFields):
    """What completions and chat completions share."""
    model: str | None = None
    max_tokens: Int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: Int = 1
    frequency_penalty: Number = 0.0
    presence_penalty: Number = 0.0
    logit_bias: dict[str, Number] | None = None
    return_token_ids: bool = False          # vLLM extension: the token ids beside the text

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v):
        return _must_be(v, (1,), f"only n=1 is supported, got {v}")

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalty(cls, v):
        return _must_be(v, (0,), f"penalties are not supported (only 0), got {v}")

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v):
        return _must_be(v, (None, {}), "logit_bias is not supported")

    @model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


TokenIds = Annotated[list[Int], Field(min_length=1)]


class CompletionRequest(GenerationRequest):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    echo: bool = False
    logprobs: Int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: Int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("must not be an empty list")
        return v

    @field_validator("best_of")
    @classmethod
    def _one_best(cls, v):
        return _must_be(v, (None, 1), f"only best_of=1 is supported, got {v}")

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v):
        return _must_be(v, (None,), "suffix is not supported")

    def prompts(self) -> list[str | list[int]]:
        """The batch: one entry per prompt, text or token ids."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = None
    logprobs: bool = False
    top_logprobs: Int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def conversation(self) -> list[dict]:
        """The messages as the chat template takes them ("developer" is OpenAI's new name for "system")."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


class TokenizeRequest(Strict):
    """vLLM's /tokenize: text (add_special_tokens: prepend BOS) or chat messages (rendered first)."""
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError('give exactly one of "prompt" and "messages"')
        return self


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[Int]


# ---- responses ------------------------------------------------------------------------------------
def _now() -> int:
    return int(time.time())


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens)


class CompletionLogprobs(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _omitted_if_none()
    prompt_token_ids: list[int] | None = _omitted_if_none()


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _omitted_if_none()


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = _omitted_if_none()


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _only_set(self, handler):  # OpenAI's deltas carry only the fields that changed
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _omitted_if_none()


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatStreamChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "tinyvllm"
    root: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               405: "MethodNotAllowed", 413: "RequestTooLarge", 500: "InternalServerError",
               503: "ServiceUnavailableError"}


class ApiError(Exception):
    """An answer in OpenAI's error shape: raised by a route, rendered by the app's handler."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers

    def body(self) -> dict:
        info = ErrorInfo(message=self.message, type=ERROR_TYPES.get(self.status, "Error"), param=self.param,
                         code=self.status)
        return ErrorResponse(error=info).model_dump()


UNION_HINTS = {"prompt": "text, a list of texts, a list of token ids or a list of lists of token ids",
               "stop": "a string or a list of strings",
               "content": "a string or a list of {\"type\": \"text\", \"text\": ...} parts"}


def validation_error(errors, content_type: str | None = None) -> ApiError:
    """A 400 naming the first invalid field (pydantic's errors; FastAPI puts "body" first in their locations).
    `content_type`: the request's, named when the body was not read as JSON because of it."""
    first = errors[0]
    loc = [part for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return ApiError(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}")
    message = first.get("msg", "invalid value").removeprefix("Value error, ")
    if not loc:  # the body as a whole: missing, not an object, or a rule across fields
        kind = first.get("type", "")
        if kind == "missing":
            return ApiError(400, "the body is missing: expected a JSON object")
        if kind.endswith("_type") and isinstance(first.get("input"), (bytes, bytearray)):
            # FastAPI reads a body as JSON only when the Content-Type header says so
            sent = f"as Content-Type: {content_type}" if content_type else "without a Content-Type header"
            return ApiError(400, f"the body was sent {sent}; send JSON with Content-Type: application/json")
        if kind.endswith("_type"):
            return ApiError(400, f"the body must be a JSON object, got {type(first.get('input')).__name__}")
        return ApiError(400, message)
    param = str(loc[0])
    if first.get("type") == "extra_forbidden":
        return ApiError(400, f"unknown field {'.'.join(map(str, loc))!r}", param=param)
    union = next((i for i, p in enumerate(loc) if isinstance(p, str) and p in UNION_HINTS), None)
    if union is not None and len(errors) > 1:  # pydantic reports each member of the union: name the union
        where = ".".join(str(p) for p in loc[:union + 1])
        return ApiError(400, f"{where}: expected {UNION_HINTS[loc[union]]}", param=param)
    where = ".".join(str(p) for p in loc)
    return ApiError(400, f"{where}: {message}", param=param)
