"""The ledger document and the one pure projection from observed truth to derived state.

Three kinds of data live in a task record, and they never mix:

- `observations`: what happened, append-only (bounded: the oldest are dropped and counted,
  the truth they carried stays folded into `observed`);
- `observed`: the truth as owner, executor and external observers reported it;
- `derived`: computed by `derive(observed)` and nothing else, rewritten on every write, so a
  half-done state written by hand is overwritten by the projection rather than believed.

`supervision` is the monitor's own bookkeeping (nudges sent, retries requested); it is
neither truth nor projection and `derive` never reads it.

Root rules, each enforced here and tested: nothing is OK without observed truth; progress on
a step does not complete it; only completion truth completes the task; contradictory truth is
reported as an inconsistency, never resolved by guessing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Final, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    model_validator,
)

from taskcard.producers.ledger.contract import FailureKind, Outcome, Workflow
from taskcard.producers.task_card.contract import MAX_COUNT as CONTRACT_MAX_COUNT
from taskcard.producers.task_card.contract import shows_text

EventType = Literal[
    "STARTED",
    "STEP_PROGRESS",
    "STEP_COMPLETED",
    "TASK_COMPLETED",
    "BLOCKED_CONFIRMED",
    "OWNER_RESUMED",
    "OWNER_REPLY_RECORDED",
    "EXTERNAL_OBSERVED",
    "DOWNLOAD_OBSERVED",
    "HEARTBEAT",
]
EVENT_TYPES: Final[tuple[str, ...]] = get_args(EventType)

# The events a `checkpoint` may record; the others have their own commands, which require
# the fields that give them meaning (a block needs its kind, a reply its letter).
CHECKPOINT_EVENTS: Final[tuple[str, ...]] = EVENT_TYPES

# `FailureKind`, `Workflow` and `Outcome` are the file contract's (`contract.py`), which the
# service reads without pydantic: one list of words each, for the model and the consumers.
FAILURE_KINDS: Final[tuple[str, ...]] = get_args(FailureKind)
# Kinds that are retried (once by default) before a block is escalated to people; typed with
# the contract's words, so a kind misspelt here is a type error, not a kind never retried.
RETRYABLE_KINDS: Final[frozenset[FailureKind]] = frozenset(
    {
        "TIMEOUT",
        "DOWNLOAD_TIMEOUT",
        "DOWNLOAD_INCOMPLETE",
        "TRANSIENT_NETWORK",
        "EXECUTION_ERROR",
        "EXTERNAL_WAIT",
    }
)

Source = Literal["owner", "executor", "external", "monitor"]
OwnerReply = Literal["A", "B", "C", "D", "E"]
OWNER_REPLIES: Final[dict[str, str]] = {
    "A": "in progress: the ledger was not updated",
    "B": "blocked: a reason and a safe next step are recorded",
    "C": "completed",
    "D": "no reply: go and find external evidence",
    "E": "forgotten or not being done: resume now",
}
JobStatus = Literal["submitted", "running", "succeeded", "failed", "cancelled"]
PENDING_JOB_STATUSES: Final = frozenset({"submitted", "running"})
StepState = Literal["PENDING", "RUNNING", "DONE", "BLOCKED", "FAILED"]
TruthState = Literal["NO_TRUTH", "OBSERVED", "INCONSISTENT"]

MAX_OBSERVATIONS: Final = 500
MAX_NOTE_CHARS: Final = 500
MAX_SECONDS: Final = 10 * 365 * 24 * 3600.0  # the largest threshold or wait: ten years
MAX_COUNT: Final = 1000  # the most nudges or retries a task may allow
# The largest byte count a download may give (its size seen on disk, its full size): the
# contracts' bound on a count read from an agent's files, 10^15 bytes (a petabyte). No real
# download comes near it, and JSON readers of other languages hold it exactly (below 2^53).
MAX_BYTES: Final = CONTRACT_MAX_COUNT


def _in_utc(moment: datetime) -> datetime:
    """A time without an offset is UTC, as in every other file of the contracts; one with an
    offset is converted. Naive and aware times cannot be compared, so one naive time written
    by other tooling made every command on the task fail with a traceback."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise ValueError("out of range once converted to UTC") from None


Moment = Annotated[datetime, AfterValidator(_in_utc)]
Ident = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")]


def note_problem(value: str) -> str | None:
    """What is wrong with a text of the ledger (a purpose, a reason, a note), None when
    nothing: the one rule for both directions, so the writers refuse a text (`store._note`)
    and a task read from the file holding one is broken, named with the field (the `Note`
    type), by the same words. A NUL has no use in any of them, and a lone surrogate cannot
    be written as UTF-8; a hand edit left a NUL that the writers refused in a purpose, and
    the card renderer wrote it into `taskcard.md`."""
    if len(value) > MAX_NOTE_CHARS:
        return f"{len(value)} characters, at most {MAX_NOTE_CHARS}"
    if "\0" in value:
        # As the task_card envelope refuses one.
        return "contains a NUL character; remove it"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "holds bytes that are not UTF-8 (undecodable input); pass UTF-8 text"
    return None


def _checked_note(value: str) -> str:
    problem = note_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


Note = Annotated[str, AfterValidator(_checked_note)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Limits(_Model):
    """Inactivity thresholds: they measure time since the last progress delta, not task age.

    Finite and bounded: JSON has no infinity (it would be saved as null and make the whole
    ledger unreadable, every task in it), and a threshold of centuries is no threshold."""

    nudge_after_sec: float = Field(default=1800.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    timeout_sec: float = Field(default=7200.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    # 0: heartbeats are not expected
    heartbeat_every_sec: float = Field(default=300.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False)
    renotify_sec: float = Field(default=300.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False)
    max_nudges: int = Field(default=2, ge=0, le=MAX_COUNT)
    max_retries: int = Field(default=1, ge=0, le=MAX_COUNT)
    external_max_wait_sec: float = Field(default=3600.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)


class TaskInfo(_Model):
    task_id: Ident
    purpose: Note
    created_at: Moment
    limits: Limits = Field(default_factory=Limits)
    # True when `init` was given the steps: a step not among them is then refused unless it
    # is added on purpose. False (a task without a plan, or one written by other tooling):
    # steps join as they are recorded.
    planned: bool = False


class Observation(_Model):
    seq: int = Field(ge=1)
    at: Moment
    event_type: EventType
    source: Source
    step: Ident | None = None
    note: Note | None = None


class StepTruth(_Model):
    step_id: Ident
    progress_at: Moment | None = None
    progress_note: Note | None = None
    completed_at: Moment | None = None
    failed_at: Moment | None = None


class CompletionTruth(_Model):
    completed_at: Moment
    source: Source
    summary: Note
    artifacts: list[Note] = Field(default_factory=list, max_length=50)


class BlockTruth(_Model):
    blocked_at: Moment
    kind: FailureKind
    reason: Note
    source: Source
    step: Ident | None = None
    safe_next_step: Note | None = None
    failed: bool = False  # the step failed for good (no retry can help)
    resolved_at: Moment | None = None
    resolved_by: EventType | None = None

    @property
    def active(self) -> bool:
        return self.resolved_at is None


class OwnerTruth(_Model):
    reply: OwnerReply | None = None
    reply_at: Moment | None = None
    note: Note | None = None
    resumed_at: Moment | None = None


class ExternalJob(_Model):
    job_id: Ident
    provider: Note
    status: JobStatus
    evidence: Note | None = None  # the provider's own id, URL or status line
    observed_at: Moment
    status_changed_at: Moment
    max_wait_sec: float = Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)


class Download(_Model):
    name: Ident
    observed_at: Moment
    # Past MAX_BYTES (a hand edit, another writer): the task is broken, named with the field.
    observed_bytes: int = Field(ge=0, le=MAX_BYTES)
    expected_bytes: int | None = Field(default=None, ge=0, le=MAX_BYTES)
    complete: bool = False
    corrupt: bool = False


class ExecutorHealth(_Model):
    last_success_at: Moment | None = None


class Observed(_Model):
    started_at: Moment | None = None
    steps: list[StepTruth] = Field(default_factory=list)
    task_completion: CompletionTruth | None = None
    block: BlockTruth | None = None
    owner: OwnerTruth = Field(default_factory=OwnerTruth)
    external_jobs: list[ExternalJob] = Field(default_factory=list)
    downloads: list[Download] = Field(default_factory=list)
    executor_health: ExecutorHealth = Field(default_factory=ExecutorHealth)
    last_delta_at: Moment | None = None
    last_delta_source: EventType | None = None


class Inconsistency(_Model):
    code: str
    detail: str


class Derived(_Model):
    workflow: Workflow = "NOT_STARTED"
    current_step: str | None = None
    step_index: int | None = None  # 1-based position of current_step
    step_count: int = 0
    steps_done: int = 0
    step_states: dict[str, StepState] = Field(default_factory=dict)
    pending_external: list[str] = Field(default_factory=list)
    truth_state: TruthState = "NO_TRUTH"
    outcome: Outcome = "IN_PROGRESS"
    next_gate: str = "unknown"
    inconsistencies: list[Inconsistency] = Field(default_factory=list)


class Supervision(_Model):
    """The monitor's bookkeeping: what it already asked for, so it asks once per episode."""

    last_action: str | None = None
    last_action_at: Moment | None = None
    last_action_key: str | None = None
    nudges_sent: int = Field(default=0, ge=0)
    nudged_for: Moment | None = None  # the progress delta the nudges counted against
    retries_requested: int = Field(default=0, ge=0)
    retried_block: str | None = None  # "<step>:<kind>" of the block the retries belong to
    last_retry_at: Moment | None = None
    stopped_at: Moment | None = None


class TaskRecord(_Model):
    task: TaskInfo
    observations: list[Observation] = Field(default_factory=list)
    observations_dropped: int = Field(default=0, ge=0)
    # The next observation's seq; a hand edit that lowers it below the last one recorded is
    # not followed (seqs never repeat), one below 1 makes the task broken, naming the field.
    next_seq: int = Field(default=1, ge=1)
    observed: Observed = Field(default_factory=Observed)
    derived: Derived = Field(default_factory=Derived)
    supervision: Supervision = Field(default_factory=Supervision)


def key_problem(key: str, record: TaskRecord) -> str | None:
    """What is wrong when a task's key in `tasks` is not the id its record holds, None when
    they agree. Commands find a task by its key and name it by its id: a hand-copied entry
    (key `t1` holding the record of `t2`) was read silently, and `supervise` printed two
    results named t2."""
    if record.task.task_id == key:
        return None
    return (
        f"task.task_id: {record.task.task_id!r} is not the task's key {key!r};"
        " write the same id in both"
    )


@dataclass(frozen=True)
class BrokenTask:
    """A task of the file whose record does not validate: its JSON text exactly as read, and
    the first problem (the field's path and what is wrong)."""

    text: str
    problem: str


class LedgerDocument(_Model):
    version: Literal[1] = 1
    tasks: dict[str, TaskRecord] = Field(default_factory=dict)
    # Tasks that do not validate, by id: never in `tasks`, written back as they were read.
    _broken: dict[str, BrokenTask] = PrivateAttr(default_factory=dict)

    @property
    def broken(self) -> dict[str, BrokenTask]:
        return self._broken

    @model_validator(mode="after")
    def _keys_name_their_tasks(self) -> LedgerDocument:
        for key, record in self.tasks.items():
            problem = key_problem(key, record)
            if problem is not None:
                raise ValueError(f"tasks.{key}.{problem}")
        return self


# ----------------------------------------------------------------------------- derivation


def step_state(step: StepTruth, block: BlockTruth | None) -> StepState:
    """Blocked, then failed, then done, then running, else pending.

    Only a completion makes a step DONE (progress never does). A block counts only while it
    is active, so a step resumed and then completed is DONE, not blocked forever. A failure
    counts until the step moves again: progress or a completion recorded after it is the
    retry the owner resumed, so a failed step retried and completed is DONE, not FAILED
    for good (which left the task unable to complete consistently).
    """
    if block is not None and block.active and block.step == step.step_id and not block.failed:
        return "BLOCKED"
    failed_for_good = step.failed_at is not None and all(
        moment is None or moment <= step.failed_at
        for moment in (step.progress_at, step.completed_at)
    )
    if failed_for_good or (
        block is not None and block.active and block.failed and block.step == step.step_id
    ):
        return "FAILED"
    if step.completed_at is not None:
        return "DONE"
    if step.progress_at is not None:
        return "RUNNING"
    return "PENDING"


def find_inconsistencies(observed: Observed) -> list[Inconsistency]:
    """Contradictions in the truth. Each one is reported; none is explained away."""
    found: list[Inconsistency] = []
    completion = observed.task_completion
    block = observed.block if observed.block is not None and observed.block.active else None
    states = [step_state(step, observed.block) for step in observed.steps]
    for step in observed.steps:
        if step.completed_at and step.progress_at and step.progress_at > step.completed_at:
            found.append(
                Inconsistency(
                    code="progress_after_step_completed",
                    detail=f"step {step.step_id} reported progress after its completion",
                )
            )
        if completion and step.progress_at and step.progress_at > completion.completed_at:
            found.append(
                Inconsistency(
                    code="progress_after_task_completed",
                    detail=f"step {step.step_id} reported progress after the task completed",
                )
            )
    for download in observed.downloads:
        if download.corrupt:
            found.append(
                Inconsistency(
                    code="download_corrupt", detail=f"download {download.name} is corrupt"
                )
            )
        elif (
            download.complete
            and download.expected_bytes is not None
            and download.observed_bytes != download.expected_bytes
        ):
            found.append(
                Inconsistency(
                    code="download_size_mismatch",
                    detail=f"download {download.name} is called complete with "
                    f"{download.observed_bytes} of {download.expected_bytes} bytes",
                )
            )
    if completion and block:
        found.append(
            Inconsistency(code="completed_and_blocked", detail="the task is completed and blocked")
        )
    if completion:
        open_steps = [
            s.step_id for s, st in zip(observed.steps, states, strict=True) if st != "DONE"
        ]
        if open_steps:
            found.append(
                Inconsistency(
                    code="completed_with_open_steps",
                    detail="the task is completed but steps are not done: " + ", ".join(open_steps),
                )
            )
    for job in observed.external_jobs:
        if job.status not in PENDING_JOB_STATUSES:
            continue
        if completion:
            found.append(
                Inconsistency(
                    code="external_pending_after_completion",
                    detail=f"external job {job.job_id} is pending after the task completed",
                )
            )
        if job.evidence is None or not shows_text(job.evidence):
            found.append(
                Inconsistency(
                    code="external_pending_without_evidence",
                    detail=f"external job {job.job_id} is called pending without provider evidence",
                )
            )
    first_open: str | None = None
    for step, state in zip(observed.steps, states, strict=True):
        if state in ("DONE", "RUNNING") and first_open is not None:
            found.append(
                Inconsistency(
                    code="step_out_of_order",
                    detail=f"step {step.step_id} is {state.lower()} while the earlier step "
                    f"{first_open} is not done",
                )
            )
        if state != "DONE" and first_open is None:
            first_open = step.step_id
    return found


def _next_gate(observed: Observed, derived: Derived) -> str:
    """What has to happen next for the task to move, in a closed vocabulary plus an id."""
    if derived.truth_state == "NO_TRUTH":
        return "unknown"
    if derived.workflow == "COMPLETED":
        return "none: completed"
    if derived.workflow == "INCONSISTENT":
        return "owner reconciles the truth"
    block = observed.block
    if block is not None and block.active:
        return f"decision on block {block.kind}"
    if derived.pending_external:
        return f"external job {derived.pending_external[0]}"
    if derived.current_step is not None:
        return f"complete step {derived.current_step}"
    return "task completion"


def moved_at(observed: Observed) -> datetime | None:
    """When the task last moved: `last_delta_at`, which the ledger's own writers keep. A ledger
    written by other tooling may fill in only the truths; then it is the latest moment one of
    them records movement (step progress or completion, completion, a job's status, a
    download, a heartbeat, a resume, the start), so its truth counts and its monitor does not
    measure idleness from the task's creation."""
    if observed.last_delta_at is not None:
        return observed.last_delta_at
    moments = [
        observed.started_at,
        observed.executor_health.last_success_at,
        observed.owner.resumed_at,
        observed.task_completion.completed_at if observed.task_completion else None,
    ]
    for step in observed.steps:
        moments += [step.progress_at, step.completed_at]
    moments += [job.status_changed_at for job in observed.external_jobs]
    moments += [download.observed_at for download in observed.downloads]
    return max((moment for moment in moments if moment is not None), default=None)


def derive(observed: Observed) -> Derived:
    """The derived state of a task: a pure function of its observed truth and nothing else."""
    states = {step.step_id: step_state(step, observed.block) for step in observed.steps}
    inconsistencies = find_inconsistencies(observed)
    pending = [j.job_id for j in observed.external_jobs if j.status in PENDING_JOB_STATUSES]
    current_index = next(
        (i for i, step in enumerate(observed.steps) if states[step.step_id] != "DONE"), None
    )
    # Truth is anything observed: movement, or a confirmed block (not movement, but seen).
    has_truth = moved_at(observed) is not None or observed.block is not None
    block = observed.block if observed.block is not None and observed.block.active else None
    failed = any(state == "FAILED" for state in states.values())
    workflow: Workflow
    if inconsistencies:
        workflow = "INCONSISTENT"
    elif observed.task_completion is not None:
        workflow = "COMPLETED"
    elif failed:
        workflow = "FAILED"
    elif block is not None:
        workflow = "BLOCKED"
    elif pending:
        workflow = "WAITING_EXTERNAL"
    elif has_truth or observed.started_at is not None:
        workflow = "RUNNING"
    else:
        workflow = "NOT_STARTED"
    truth_state: TruthState = (
        "INCONSISTENT" if inconsistencies else ("OBSERVED" if has_truth else "NO_TRUTH")
    )
    steps_done = sum(1 for state in states.values() if state == "DONE")
    has_artifacts = bool(observed.downloads) or bool(
        observed.task_completion and observed.task_completion.artifacts
    )
    outcome: Outcome
    if workflow == "COMPLETED":
        outcome = "SUCCESS"
    elif workflow == "FAILED":
        outcome = "FAILED"
    elif workflow == "BLOCKED":
        outcome = "PARTIAL_SUCCESS" if has_artifacts or steps_done else "BLOCKED"
    else:
        outcome = "IN_PROGRESS"
    derived = Derived(
        workflow=workflow,
        current_step=observed.steps[current_index].step_id if current_index is not None else None,
        step_index=current_index + 1 if current_index is not None else None,
        step_count=len(observed.steps),
        steps_done=steps_done,
        step_states=states,
        pending_external=pending,
        truth_state=truth_state,
        outcome=outcome,
        inconsistencies=inconsistencies,
    )
    derived.next_gate = _next_gate(observed, derived)
    return derived
