"""The options of ``python -m localcluster.run`` as typed values.

`RunOptions.from_namespace` is made once from what argparse parsed
(`args.parser`); from there each part of the command line takes the group
it uses, not the whole command line:

- `JobOptions` -- which job, and the options that shape it (``--nodes``,
  ``--epochs``, ``--seed``, ``--threads``): what `jobspec.build_job`
  passes to the job function and the run file records;
- `SessionOptions` -- what the session is opened with: its kind, Ray's
  address, the timeout, the fault plan and the cluster conditions
  (`conditions.session_options`), the CPUs (`cpus.apply_cpus`);
- `LogOptions` -- where node output goes (`train.logs.log_options`);
- the rest (the checkpoint directory, resuming, restarts, what is shown
  and written) on `RunOptions` itself, read by the run (`train.loop.Run`).

`RunOptions.as_record()` gives the options back flat, by their option
names, for the run's history (``metrics.jsonl``'s ``options``).
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["DEFAULT_JOB", "JOB_OPTIONS", "JobOptions", "SessionOptions",
           "LogOptions", "RunOptions"]

#: the job trained when ``--job`` is not given
DEFAULT_JOB = "localcluster.examples.regression:build"
#: the options that shape a job: passed to its function when it takes
#: them, recorded with its checkpoints, compared on ``--resume``
JOB_OPTIONS = ("nodes", "epochs", "seed", "threads")


@dataclass
class JobOptions:
    """Which job (``job``: ``MODULE:FUNC``; None: the embedded one) and
    the options given that shape it (None: not given)."""
    job: Optional[str] = None
    nodes: Optional[int] = None
    epochs: Optional[int] = None
    seed: Optional[int] = None
    threads: Optional[int] = None

    @property
    def spec(self):
        """The job function's ``MODULE:FUNC`` (the embedded job's too)."""
        return self.job or DEFAULT_JOB

    @property
    def embedded(self):
        return self.job is None

    def given(self):
        """``{option: value}`` of the job options given."""
        return {k: getattr(self, k) for k in JOB_OPTIONS
                if getattr(self, k) is not None}


@dataclass
class SessionOptions:
    """What the run's session is opened with (``kind``: ``--session``,
    None until `conditions.resolve_session` picks the default)."""
    kind: Optional[str] = None
    ray_address: Optional[str] = None
    timeout: Optional[float] = None
    faults: object = None                       # a FaultPlan, or None
    slowdown: list = field(default_factory=list)
    link: list = field(default_factory=list)
    stragglers: Optional[int] = None
    simulate: bool = False
    op_seconds: object = None                   # seconds, "measured", None
    cpus: list = field(default_factory=list)    # [(pattern, [cpu ids])]


@dataclass
class LogOptions:
    """Where node output goes: ``--log-dir``, ``--tee``, ``--log-nodes``."""
    log_dir: Optional[str] = None
    tee: bool = False
    log_nodes: list = field(default_factory=list)


@dataclass
class RunOptions:
    """Everything ``python -m localcluster.run`` was given."""
    job: JobOptions = field(default_factory=JobOptions)
    session: SessionOptions = field(default_factory=SessionOptions)
    logs: LogOptions = field(default_factory=LogOptions)
    checkpoint_dir: Optional[str] = None
    keep_last: Optional[int] = None
    resume: object = None                       # an epoch, "latest", None
    overwrite: bool = False
    max_restarts: Optional[int] = None
    check: Optional[str] = None
    max_examples: int = 20
    print_plan: bool = False
    trace: Optional[str] = None
    report: Optional[str] = None
    json: bool = False
    verbose: bool = False
    log_level: str = "WARNING"
    cleanup: bool = False
    #: the option names in the order the command line lists them
    order: tuple = field(default=(), repr=False, compare=False)

    #: the groups, and the option name of a field that differs from it
    _GROUPS = {"job": JobOptions, "session": SessionOptions,
               "logs": LogOptions}
    _RENAMED = {("session", "kind"): "session"}

    @classmethod
    def from_namespace(cls, ns):
        """The options argparse parsed into ``ns`` (every option of
        `args.parser` is a field of one group or of this class)."""
        values = vars(ns)
        groups = {}
        for name, group in cls._GROUPS.items():
            groups[name] = group(**{
                f.name: values[cls._RENAMED.get((name, f.name), f.name)]
                for f in dataclasses.fields(group)})
        rest = {f.name: values[f.name] for f in dataclasses.fields(cls)
                if f.name not in cls._GROUPS and f.name != "order"}
        return cls(**groups, **rest, order=tuple(values))

    def as_record(self):
        """``{option name: value}`` of every option given (not None, False
        or empty), flat as on the command line."""
        out = {}
        for name, group in self._GROUPS.items():
            for f in dataclasses.fields(group):
                out[self._RENAMED.get((name, f.name), f.name)] = \
                    getattr(getattr(self, name), f.name)
        out.update((f.name, getattr(self, f.name))
                   for f in dataclasses.fields(self)
                   if f.name not in self._GROUPS and f.name != "order")
        rank = {name: i for i, name in enumerate(self.order)}
        return {k: out[k] for k in sorted(out, key=lambda k: rank.get(
            k, len(rank))) if out[k] is not None and out[k] is not False
            and out[k] != []}
