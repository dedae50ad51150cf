"""The gateway's JSON bodies. Strict types: "5" is not a number and 1.0 is not a token id."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

_U32 = 2**32 - 1


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "examples": [{"prompt": "Hello", "max_tokens": 16, "top_k": 1}]})

    prompt: str | list[str] | None = Field(None, description="Text (or a batch of texts); needs a "
                                           "text model (ensemble) or a gateway --tokenizer.")
    input_ids: list[list[int]] | list[int] | None = Field(None, description="Token ids (or a batch of rows).")
    max_tokens: int = Field(16, ge=1, description="Tokens to generate (request_output_len).")
    top_k: int | None = Field(None, ge=0, le=_U32)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    temperature: float | None = Field(None, gt=0.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    random_seed: int | None = Field(None, ge=0, le=2**64 - 1)
    beam_width: int | None = Field(None, ge=1, le=1024)
    end_id: int | None = Field(None, ge=0, le=_U32)

    @model_validator(mode="after")
    def _one_input(self) -> GenerateRequest:
        if (self.prompt is None) == (self.input_ids is None):
            raise ValueError("give exactly one of 'prompt' or 'input_ids'")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("'prompt' is an empty list")
        if self.prompt == "" or (isinstance(self.prompt, list) and "" in self.prompt):
            raise ValueError("'prompt' is empty")
        if self.input_ids is not None:
            rows = self.id_rows()
            if not rows or any(not r for r in rows):
                raise ValueError("'input_ids' has an empty row")
            if any(t < 0 or t > _U32 for r in rows for t in r):
                raise ValueError("'input_ids' holds ids outside 0..2^32-1")
        return self

    def id_rows(self) -> list[list[int]]:
        ids = self.input_ids or []
        return [ids] if ids and isinstance(ids[0], int) else ids  # type: ignore[list-item,return-value]

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt or [])

    @property
    def batch_size(self) -> int:
        return len(self.prompts()) if self.prompt is not None else len(self.id_rows())


class GenerateResponse(BaseModel):
    model: str
    output_ids: list[list[list[int]]] | None = Field(
        None, description="[batch][beam][tokens], as the FT model returns them (GPT: prompt + "
                          "generated), cut at sequence_length.")
    sequence_length: list[list[int]] | None = None
    text: list[list[str]] | None = Field(None, description="[batch][beam] decoded sequences, when a "
                                         "tokenizer is configured or the model returns text.")


class Health(BaseModel):
    status: str
    triton: str
    model: str
    detail: str | None = None
