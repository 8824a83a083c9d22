"""State machines as data (CONVENTIONS.md "State machines").

Each authority declares one :class:`StateMachine` in its app's
``transitions.py``. Stores call :meth:`StateMachine.assert_transition` before
any SQL, so an unlisted pair never reaches the database.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import IllegalTransition

REGISTRY: dict[str, StateMachine] = {}


@dataclass(frozen=True)
class StateMachine:
    """A closed transition table.

    Attributes:
        name: ``"<app_label>.<Model>"``; the key used by ``manage.py state_graph``.
        transitions: ``{source: frozenset(targets)}``; every state is a key.
        initial: states a row may be inserted in.
        terminal: states with no outgoing transition.
        seed: the seed section the table implements.
        parked: non-terminal states that are intentionally parked for an operator.
        reason_required: states whose rows must carry a registered, non-empty
            ``reason_code`` (halted, quarantined, refused); the CAS store
            refuses a move into one without it, before SQL, and the model has a
            CHECK constraint (seed 003, "Operational liveness and maintenance
            admission"). A row in any other state carries no code.
        reason_owners: apps whose registered codes rows of this machine may
            carry; by default only the machine's own app.
    """

    name: str
    transitions: dict[str, frozenset[str]]
    initial: frozenset[str]
    seed: str
    parked: frozenset[str] = field(default_factory=frozenset)
    reason_required: frozenset[str] = field(default_factory=frozenset)
    reason_owners: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not self.reason_owners:
            object.__setattr__(self, "reason_owners", frozenset({self.name.split(".")[0]}))
        states = set(self.transitions)
        for src, targets in self.transitions.items():
            unknown = set(targets) - states
            if unknown:
                raise ValueError(f"{self.name}: {src} -> unknown states {sorted(unknown)}")
        if not self.initial <= states:
            raise ValueError(f"{self.name}: unknown initial states")
        if not self.reason_required <= states:
            raise ValueError(f"{self.name}: unknown reason_required states")
        REGISTRY[self.name] = self

    @property
    def states(self) -> frozenset[str]:
        return frozenset(self.transitions)

    @property
    def terminal(self) -> frozenset[str]:
        return frozenset(s for s, t in self.transitions.items() if not t)

    @property
    def settled(self) -> frozenset[str]:
        """Terminal or intentionally parked states."""
        return self.terminal | self.parked

    def allows(self, src: str, dst: str) -> bool:
        return dst in self.transitions.get(src, frozenset())

    def assert_transition(self, src: str, dst: str) -> None:
        """Raise unless ``src -> dst`` is listed.

        Raises:
            IllegalTransition: the pair is not in the table (or a state is unknown).
        """
        if not self.allows(src, dst):
            raise IllegalTransition(f"{self.name}: {src} -> {dst} is not a listed transition")

    def assert_initial(self, state: str) -> None:
        if state not in self.initial:
            raise IllegalTransition(f"{self.name}: cannot insert a row in state {state}")

    def pairs(self) -> list[tuple[str, str]]:
        return sorted((s, d) for s, ts in self.transitions.items() for d in ts)

    def to_text(self) -> str:
        lines = [f"{self.name}  ({self.seed})", f"initial: {', '.join(sorted(self.initial))}"]
        if self.parked:
            lines.append(f"parked for an operator: {', '.join(sorted(self.parked))}")
        if self.reason_required:
            lines.append(f"reason code required in: {', '.join(sorted(self.reason_required))}")
        for src in sorted(self.transitions):
            targets = ", ".join(sorted(self.transitions[src])) or "(terminal)"
            lines.append(f"  {src} -> {targets}")
        return "\n".join(lines)

    def to_dot(self) -> str:
        out = [f'digraph "{self.name}" {{', "  rankdir=LR;"]
        for state in sorted(self.initial):
            out.append(f'  "__start_{state}" [shape=point]; "__start_{state}" -> "{state}";')
        for state in sorted(self.states):
            attrs = []
            if state in self.terminal:
                attrs.append("shape=doublecircle")
            if state in self.parked:
                attrs.append("style=dashed")
            if state in self.reason_required:
                attrs.append('color=red, xlabel="reason code"')
            if attrs:
                out.append(f'  "{state}" [{", ".join(attrs)}];')
        for src, dst in self.pairs():
            out.append(f'  "{src}" -> "{dst}";')
        out.append("}")
        return "\n".join(out)


def machine(name: str, table: dict[str, set[str] | frozenset[str]], *, initial: set[str], seed: str,
            parked: set[str] | None = None, reason_required: set[str] | None = None,
            reason_owners: set[str] | None = None) -> StateMachine:
    """Build and register a :class:`StateMachine` from a plain dict."""
    return StateMachine(
        name=name,
        transitions={k: frozenset(v) for k, v in table.items()},
        initial=frozenset(initial),
        seed=seed,
        parked=frozenset(parked or ()),
        reason_required=frozenset(reason_required or ()),
        reason_owners=frozenset(reason_owners or ()),
    )


#: Suffixes whose modules :func:`import_app_modules` already imported for every installed app.
_IMPORTED: set[str] = set()


def import_app_modules(suffix: str) -> None:
    """Import ``<app>.<suffix>`` for every installed app that has one (once per process and suffix: every
    row insert asks for the stores, and a failed import of a missing module costs a file-system search)."""
    import importlib

    from django.apps import apps

    if suffix in _IMPORTED and apps.ready:
        return
    for config in apps.get_app_configs():
        module = f"{config.name}.{suffix}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    if apps.ready:
        _IMPORTED.add(suffix)


def load_all_machines() -> dict[str, StateMachine]:
    """Return every registered machine, importing each app's ``transitions`` first."""
    import_app_modules("transitions")
    return REGISTRY
