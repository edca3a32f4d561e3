"""The workflow format of DESIGN.md as pydantic models (``extra="forbid"``).

Template strings stay strings here; ``stockade.spec.validate`` compiles and
checks them through ``stockade.expr``. Pure: no I/O.

Must not import workspace, sandbox, runner, agent, publish, store, web or cli.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from stockade.spec.sizes import parse_size

ID_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"
Ident = Annotated[str, StringConstraints(pattern=ID_PATTERN, max_length=64)]
SecretName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


def _size(value: int | str) -> int | str:
    parse_size(value)  # raises ValueError with what to write instead
    return value


#: A size such as 512, "512M", "2G" (bytes when bare); kept as written, for messages.
Size = Annotated[int | str, Field(union_mode="left_to_right"), AfterValidator(_size)]

TOOL_NAMES = ("read_file", "list_dir", "create_file", "apply_patch")
STEP_KINDS = ("run", "agent", "keep", "publish")


class _Strict(BaseModel):
    # inf and nan parse as YAML floats (.inf, 1e400) and would reach the
    # kernel's limits and the clock as numbers no platform takes.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True,
                              allow_inf_nan=False)


#: The largest ``timeout`` and ``max_age``: a year, in seconds.
YEAR = 365 * 86400


#: Every boolean of the workflow is a YAML true or false: pydantic would take
#: "yes", "off", 1 and 0, and a quoted "false" would read as true to a person.
class SandboxSettings(_Strict):
    require: StrictBool = False


class Resources(_Strict):
    memory: Size | None = None
    cpu_seconds: Annotated[int, Field(gt=0, le=10**9)] | None = None
    #: At most Linux's ``PID_MAX_LIMIT``: more is no limit at all.
    processes: Annotated[int, Field(gt=0, le=4194304)] | None = None
    file_size: Size | None = None


PROVIDERS = ("openai", "openai-responses", "azure", "anthropic")
MODEL_PATTERN = r"^(openai|openai-responses|azure|anthropic)/.+$"
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


class Thinking(_Strict):
    """Anthropic extended thinking, passed through as the ``thinking`` field."""

    type: Literal["enabled", "adaptive", "disabled"] = "enabled"
    #: tokens the model may think (``enabled`` only; at least 1024)
    budget_tokens: Annotated[int, Field(ge=1024)] | None = None
    display: Literal["summarized", "omitted"] | None = None

    @model_validator(mode="after")
    def _budget(self) -> Thinking:
        if self.type == "enabled" and self.budget_tokens is None:
            raise ValueError("thinking of type enabled needs budget_tokens (at least 1024)")
        if self.type != "enabled" and self.budget_tokens is not None:
            raise ValueError(f"budget_tokens applies to thinking of type enabled, not {self.type}")
        return self


class AgentParams(_Strict):
    """Settings passed to the provider (each translated to its own field name)."""

    max_tokens: Annotated[int, Field(gt=0, le=1_000_000)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    tool_choice: Literal["auto", "required", "none"] | None = None
    thinking: Thinking | None = None


class Endpoint(_Strict):
    """Another server or key for one step."""

    base_url: Annotated[str, StringConstraints(pattern=r"^https?://[^\s/]+.*$")] | None = None
    #: the host variable holding the key (never the key itself)
    api_key_env: EnvName | None = None
    #: Azure's ``api-version`` (azure/ only)
    api_version: Annotated[str, StringConstraints(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}(-preview)?$")] | None = None


class Budget(_Strict):
    #: input + output tokens the item's model calls may spend
    tokens: Annotated[int, Field(gt=0)]


class Agent(_Strict):
    model: Annotated[str, StringConstraints(pattern=MODEL_PATTERN)] = Field(
        default="openai/gpt-4.1-mini",
        description="provider/model: openai (chat completions, any compatible server), "
                    "openai-responses (Responses API), azure (a deployment), anthropic (messages)",
    )
    prompt: Annotated[str, StringConstraints(min_length=1)]
    tools: list[Literal["read_file", "list_dir", "create_file", "apply_patch"]] = Field(
        default_factory=lambda: ["read_file", "list_dir"]  # type: ignore[arg-type]
    )
    writes: list[Annotated[str, StringConstraints(min_length=1)]] = Field(
        default_factory=lambda: ["out/**"]
    )
    max_turns: Annotated[int, Field(gt=0, le=1000)] = 20
    approve: Literal["auto", "ask"] = "auto"
    #: seconds for one model call; always finite
    request_timeout: Annotated[float, Field(gt=0, le=86400)] = 600
    params: AgentParams = Field(default_factory=AgentParams)
    endpoint: Endpoint | None = None
    budget: Budget | None = None


class Publish(_Strict):
    to: Annotated[str, StringConstraints(min_length=1)]
    key: Annotated[str, StringConstraints(min_length=1)]
    payload: Any
    #: A template over ``vars`` and ``run`` (default: ``<workflow>.<step>``).
    lease: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    lease_ttl: Annotated[float, Field(gt=0, le=86400)] = 300
    max_age: Annotated[float, Field(gt=0, le=YEAR)] = 86400


NetworkHost = Annotated[str, StringConstraints(pattern=r"^(\*\.)?[A-Za-z0-9.-]+(:[0-9]{1,5})?$")]
#: A host path, absolute or relative to the workflow file (``checks`` says what is refused).
HostPath = Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class Step(_Strict):
    id: Ident
    needs: list[Ident] = Field(default_factory=list)
    for_each: Any = None
    inputs: dict[str, Any] = Field(default_factory=dict)
    env: dict[EnvName, Any] = Field(default_factory=dict)
    secrets: list[SecretName] = Field(default_factory=list)
    #: A template over ``item`` naming each item (with ``for_each``).
    key: Annotated[str, StringConstraints(min_length=1)] | None = None
    #: Names or globs under ``out/`` an item must produce (``run:`` and ``agent:``).
    outputs: list[Annotated[str, StringConstraints(min_length=1)]] = Field(default_factory=list)
    timeout: Annotated[float, Field(gt=0, le=YEAR)] | None = None
    retries: Annotated[int, Field(ge=0, le=100)] = 0
    #: Seconds before the first retry; doubled each time, +/-20% jitter, at most 60 s.
    retry_delay: Annotated[float, Field(ge=0, le=3600)] = 1.0
    on_item_failure: Literal["fail", "continue"] = "fail"
    #: Whether items may be taken from earlier runs (default: run: yes, agent: no; never
    #: publish: or keep:), when the run reuses (``--reuse`` or the workflow's ``reuse:``).
    reuse: StrictBool | None = None
    network: Literal["none", "open"] | list[NetworkHost] = "none"
    resources: Resources = Field(default_factory=Resources)
    isolate: StrictBool = True
    #: Host paths shown read-only at the same path in the jail (toolchains); ``run:`` only.
    mounts: list[HostPath] = Field(default_factory=list)
    #: A root filesystem instead of the host's: a folder, an OCI layout or a ``docker
    #: save`` tarball; ``run:`` only.
    image: HostPath | None = None
    run: Annotated[str, StringConstraints(min_length=1)] | None = None
    agent: Agent | None = None
    keep: Any = None
    publish: Publish | None = None

    @field_validator("reuse", mode="before")
    @classmethod
    def _reuse_given(cls, value: Any) -> Any:
        # None stands for "not given" (the kind's default); a written null is
        # no boolean, as at the top level.
        if value is None:
            raise PydanticCustomError("bool_type", "Input should be a valid boolean")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Step:
        kinds = [k for k in STEP_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                "a step needs exactly one of run:, agent:, keep:, publish:"
                + (f" (found {', '.join(kinds)})" if kinds else "")
            )
        if self.keep is not None and self.for_each is None:
            raise ValueError("keep: decides over items, so the step needs for_each:")
        if self.key is not None and self.for_each is None:
            raise ValueError("key: names the items of a for_each:, and the step has none")
        if self.outputs and kinds[0] not in ("run", "agent"):
            raise ValueError(f"outputs: applies to run: and agent: steps, not {kinds[0]}:")
        if self.reuse and kinds[0] in ("publish", "keep"):
            raise ValueError(f"reuse: a {kinds[0]}: step is never taken from an earlier run")
        for key in ("mounts", "image"):
            if getattr(self, key) and kinds[0] != "run":
                article = "an" if kinds[0] == "agent" else "a"
                raise ValueError(f"{key}: applies to run: steps ({article} {kinds[0]}: step "
                                 "runs no program of yours)")
        if self.image is not None and not self.isolate:
            raise ValueError("image: needs the sandbox to change the step's root; a step with "
                             "isolate: false runs on the host as it is")
        return self

    @cached_property
    def kind(self) -> str:
        # Cached: the engine asks several times for every item it starts.
        return next(k for k in STEP_KINDS if getattr(self, k) is not None)


RunOutcome = Literal["succeeded", "failed", "fenced", "interrupted"]


class Notify(_Strict):
    """A webhook told about the run when it ends."""

    url: Annotated[str, StringConstraints(pattern=r"^https?://.+")]
    on: list[RunOutcome] = Field(default_factory=lambda: ["failed", "fenced", "interrupted"])  # type: ignore[arg-type]
    #: A name from the workflow's ``secrets:``; its value is sent as a bearer token.
    secret: SecretName | None = None


class Workflow(_Strict):
    name: Annotated[str, StringConstraints(pattern=ID_PATTERN, max_length=64)]
    vars: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], Any] = Field(
        default_factory=dict
    )
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    secrets: list[SecretName] = Field(default_factory=list)
    notify: list[Notify] = Field(default_factory=list)
    #: Reuse unchanged items from earlier runs by default (``--no-reuse`` turns it off).
    reuse: StrictBool = False
    #: Host paths shown read-only in every ``run:`` step's jail (toolchains).
    mounts: list[HostPath] = Field(default_factory=list)
    steps: Annotated[list[Step], Field(min_length=1)]

    def step(self, step_id: str) -> Step:
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(step_id)
