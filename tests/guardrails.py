"""Static and model checkers behind the build guardrails (ARCHITECTURE.md sections 1, 2 and 6).

Each checker takes source text (or model classes) and returns a list of
:class:`Violation`; the guardrail tests run them over the code base and the
self-tests feed them deliberately broken snippets. Nothing here imports the
code it checks, so a checker works on a snippet that does not exist on disk.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

ROOT = Path(settings.BASE_DIR)

#: L0 code: the generic mechanism (ARCHITECTURE.md section 1).
L0_DIRS = ("nexusflow", "connectors", "runtime_outbox", "cutover")


@dataclass(frozen=True, order=True)
class Violation:
    """One broken rule at one place: ``path:line`` (1-based), the rule id and what was found."""

    path: str
    line: int
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.detail}"


def relative(path: Path) -> str:
    """``path`` relative to the repository root, with forward slashes."""
    return path.resolve().relative_to(ROOT.resolve()).as_posix()


def l0_files(suffixes: Iterable[str] = (".py",)) -> Iterator[Path]:
    """Yield L0 files with one of ``suffixes``, sorted, never under ``migrations/``."""
    wanted = set(suffixes)
    for top in L0_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in wanted and "migrations" not in path.parts \
                    and "__pycache__" not in path.parts:
                yield path


def project_python_files() -> Iterator[Path]:
    """Yield every project ``*.py`` file, sorted, outside virtualenvs, caches and ``var/`` (what runs leave:
    ``make bench`` keeps the DBOS peer's virtualenv in ``var/bench/dbos-venv``)."""
    skip = {".venv", "venv", "__pycache__", ".git", "node_modules"}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if not skip.intersection(parts) and parts[0] != "var":
            yield path


# --- 1. L0 neutrality --------------------------------------------------------
def word_pattern(word: str, *, case_sensitive: bool) -> re.Pattern:
    """A pattern matching ``word`` as a whole word (``_`` and letters/digits are word characters)."""
    return re.compile(r"(?<![A-Za-z0-9_])" + re.escape(word) + r"(?![A-Za-z0-9_])",
                      0 if case_sensitive else re.IGNORECASE)


def substring_pattern(word: str) -> re.Pattern:
    """A case-insensitive pattern matching ``word`` anywhere (provider names inside identifiers)."""
    return re.compile(re.escape(word), re.IGNORECASE)


def check_neutrality(text: str, path: str, forbidden: dict[str, re.Pattern],
                     exempt: Iterable[tuple[str, str]] = ()) -> list[Violation]:
    """Report every line of ``text`` that names a forbidden L1/L2 literal.

    Args:
        text: the file's text.
        path: the repository-relative path used in the report and to match ``exempt``.
        forbidden: word -> compiled pattern (see :func:`word_pattern`, :func:`substring_pattern`).
        exempt: ``(path, exact line text stripped)`` pairs allowed to name a literal; an
            exemption covers only that one line of that one file.

    Returns:
        One violation per (line, word) hit, rule ``l0-neutrality``.
    """
    allowed = {line for p, line in exempt if p == path}
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip() in allowed:
            continue
        for word, pattern in forbidden.items():
            if pattern.search(line):
                found.append(Violation(path, number, "l0-neutrality", f"names {word!r}"))
    return found


# --- shared AST helpers ------------------------------------------------------
def _chain(node: ast.AST) -> tuple[list[ast.Call], ast.AST]:
    """Split ``a.b(...).c.d(...)`` into its calls (outermost first) and its root expression."""
    calls: list[ast.Call] = []
    while True:
        if isinstance(node, ast.Call):
            calls.append(node)
            node = node.func
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.attr == "objects":
                return calls, node
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return calls, node


def _assignments(tree: ast.AST) -> dict[ast.AST, dict[str, list[ast.AST]]]:
    """Map each function (and the module) to ``name -> assigned values`` inside it."""
    scopes: dict[ast.AST, dict[str, list[ast.AST]]] = {}

    def visit(scope: ast.AST) -> None:
        names: dict[str, list[ast.AST]] = {}
        scopes[scope] = names
        stack = list(ast.iter_child_nodes(scope))
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(node)
                continue
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        names.setdefault(target.id, []).append(node.value)
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and isinstance(node.target, ast.Name) \
                    and node.value is not None:
                names.setdefault(node.target.id, []).append(node.value)
            stack.extend(ast.iter_child_nodes(node))

    visit(tree)
    return scopes


def _enclosing(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    """Map every node to its innermost enclosing function (or the module)."""
    owner: dict[ast.AST, ast.AST] = {}

    def walk(node: ast.AST, scope: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            owner[child] = scope
            walk(child, child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else scope)

    walk(tree, tree)
    return owner


def _docstrings(tree: ast.AST) -> set[int]:
    """``id()`` of every docstring constant in ``tree``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


# --- 2. no unscoped read by id ------------------------------------------------
#: Queryset methods whose keyword arguments select rows.
READ_METHODS = frozenset({"get", "filter", "exclude", "get_or_create", "update_or_create", "in_bulk"})
#: The kernel's row readers (nexusflow/kernel/rows.py): ``first_row(Model, **filters)`` and
#: ``get_joined(Model, related, **filters)`` are a ``filter`` of ``Model``.
ROW_READERS = frozenset({"first_row", "every_row", "get_joined", "row_exists", "row_max"})
#: Keyword arguments of those methods that are not lookups.
NON_LOOKUP_KWARGS = frozenset({"defaults", "create_defaults", "field_name", "id_list", "batch_size"})
#: Lookups that constrain the tenant.
ORG_LOOKUPS = frozenset({"org_id", "org_id__in", "org_id__exact"})


@dataclass(frozen=True)
class ModelFacts:
    """What the unscoped-read rule needs about one model: whether it is a tenant row, its FK columns."""

    has_org: bool
    fk_columns: frozenset[str]


def model_facts(models: Iterable[type]) -> dict[str, ModelFacts]:
    """``Model.__name__ -> ModelFacts`` for Django model classes (``org_id`` column, FK ``*_id`` columns)."""
    facts = {}
    for model in models:
        columns = {f.attname for f in model._meta.concrete_fields}
        fks = {f.attname for f in model._meta.concrete_fields if f.is_relation}
        facts[model.__name__] = ModelFacts("org_id" in columns, frozenset(fks))
    return facts


def _dict_has_org(value: ast.AST) -> bool:
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
        return any(k.arg in ORG_LOOKUPS for k in value.keywords)
    if isinstance(value, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value in ORG_LOOKUPS for k in value.keys)
    return False


def check_unscoped_reads(source: str, path: str, models: dict[str, ModelFacts]) -> list[Violation]:
    """Report ORM reads that select a tenant row by id without constraining ``org_id``.

    A call ``<chain>.get|filter|exclude|get_or_create|update_or_create|in_bulk(...)``
    selects by id when a keyword lookup starts with ``pk``/``id`` or with an FK
    column (``<fk>_id``) of the model, or when it is ``in_bulk``. It is scoped
    when any call of the same chain, or of the local variable the chain starts
    from, passes ``org_id``/``org_id__in`` as a keyword, as a ``Q(org_id=...)``
    argument, or inside ``**kwargs`` built locally as ``dict(org_id=...)`` /
    ``{"org_id": ...}`` (the trusted-scope filter of ARCHITECTURE.md section 6).
    A chain rooted at ``Model.objects`` whose model has no ``org_id`` column is
    not a tenant row and is skipped; a chain whose model cannot be named (a
    related manager or a parameter) is checked with the FK columns of every model.

    Args:
        source: Python source text.
        path: repository-relative path for the report.
        models: :func:`model_facts` of the project's models.

    Returns:
        One violation per unscoped call, rule ``unscoped-read``.

    Raises:
        SyntaxError: ``source`` does not parse.
    """
    tree = ast.parse(source)
    scopes = _assignments(tree)
    owner = _enclosing(tree)
    every_fk = frozenset().union(*(m.fk_columns for m in models.values())) if models else frozenset()
    found = []

    def lookup(name: str, node: ast.AST) -> list[ast.AST]:
        scope = owner.get(node, tree)
        while True:
            if name in scopes.get(scope, {}):
                return scopes[scope][name]
            if scope is tree:
                return []
            scope = owner.get(scope, tree)

    def call_scoped(call: ast.Call) -> bool:
        if isinstance(call.func, ast.Attribute) and call.func.attr == "exclude":
            return False  # excluding one org scopes nothing
        for kw in call.keywords:
            if kw.arg in ORG_LOOKUPS:
                return True
            if kw.arg is None:
                if _dict_has_org(kw.value):
                    return True
                if isinstance(kw.value, ast.Name) and any(_dict_has_org(v) for v in lookup(kw.value.id, call)):
                    return True
        for arg in call.args:
            for sub in ast.walk(arg):
                if isinstance(sub, ast.Call) and any(k.arg in ORG_LOOKUPS for k in sub.keywords):
                    return True
        return False

    def chain_facts(expr: ast.AST, seen: frozenset[str]) -> tuple[bool, str | None] | None:
        """(scoped, model name or None) of the chain ``expr`` belongs to, following local names.

        ``None`` for a chain rooted in a name already being followed: a
        refinement such as ``qs = qs.filter(...)`` inherits the scope of the
        other assignments of ``qs`` rather than counting as unscoped.
        """
        calls, root = _chain(expr)
        scoped = any(call_scoped(c) for c in calls)
        if isinstance(root, ast.Attribute) and root.attr == "objects" and isinstance(root.value, ast.Name):
            return scoped, root.value.id
        if isinstance(root, ast.Name):
            if root.id in seen:
                return None
            values = lookup(root.id, expr)
            results = [r for r in (chain_facts(v, seen | {root.id}) for v in values) if r is not None]
            if results:
                return scoped or all(r[0] for r in results), results[0][1]
        return scoped, None

    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ROW_READERS
                and node.args and isinstance(node.args[0], ast.Name)):
            # ``first_row(Model, **filters)`` (nexusflow/kernel/rows.py) reads as ``Model.objects.filter(...)``.
            scoped, model_name = call_scoped(node), node.args[0].id
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in READ_METHODS:
            scoped, model_name = chain_facts(node, frozenset()) or (False, None)
        else:
            continue
        facts = models.get(model_name) if model_name else None
        if model_name and facts is None:
            continue  # ``X.objects`` of something that is not a project model
        if facts is not None and not facts.has_org:
            continue  # not a tenant row: nothing to scope by
        fk_columns = facts.fk_columns if facts is not None else every_fk
        selectors = []
        for kw in node.keywords:
            if kw.arg is None or kw.arg in NON_LOOKUP_KWARGS:
                continue
            field = kw.arg.split("__", 1)[0]
            if field in {"pk", "id"} or field in fk_columns:
                selectors.append(kw.arg)
        method = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        if method == "in_bulk":
            selectors.append("in_bulk")
        if selectors and not scoped:
            where = model_name or ast.unparse(node.func.value)[:40]
            found.append(Violation(path, node.lineno, "unscoped-read",
                                   f"{where}.{method}({', '.join(selectors)}) without org_id"))
    return found


# --- 3. raw SQL only in stores and selectors ----------------------------------
RAW_SQL_FILES = frozenset({"store.py", "selectors.py"})
#: The kernel's row primitive, below every store: it builds each model's SELECT and INSERT once
#: (docs/performance.md "Rows without a compiled queryset").
RAW_SQL_PATHS = frozenset({"nexusflow/kernel/rows.py"})
SQL_STATEMENT = re.compile(
    r"\bSELECT\b[\s\S]*\bFROM\b|\bUPDATE\s+\S+\s+SET\b|\bINSERT\s+(?:IGNORE\s+)?INTO\b|\bDELETE\s+FROM\b"
    r"|\bREPLACE\s+INTO\b"
)
RAW_METHODS = frozenset({"raw", "extra"})
EXECUTE_METHODS = frozenset({"execute", "executemany", "callproc"})


def _string_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else " ? " for v in node.values)
    return None


def check_raw_sql(source: str, path: str) -> list[Violation]:
    """Report raw SQL in a module that is neither a ``store.py`` nor a ``selectors.py``.

    Flags cursor ``.execute``/``.executemany``/``.callproc`` (on a name bound by
    ``with ... .cursor() as NAME`` / ``NAME = ... .cursor()``, a name containing
    ``cursor``, or a ``.cursor()`` call), queryset ``.raw(``/``.extra(``,
    ``RawSQL(``, and string literals (docstrings excepted) that read as an
    uppercase SQL statement: ``SELECT ... FROM``, ``UPDATE t SET``,
    ``INSERT INTO``, ``DELETE FROM``, ``REPLACE INTO``.

    Args:
        source: Python source text.
        path: repository-relative path; a ``store.py``/``selectors.py`` or a
            ``migrations/`` file is allowed raw SQL and returns ``[]``.

    Returns:
        Violations with rule ``raw-sql``, one per offending node.

    Raises:
        SyntaxError: ``source`` does not parse.
    """
    parts = path.split("/")
    if parts[-1] in RAW_SQL_FILES or path in RAW_SQL_PATHS or "migrations" in parts:
        return []
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    cursors = {"cursor"}
    for node in ast.walk(tree):
        if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name) \
                and isinstance(node.context_expr, ast.Call) and isinstance(node.context_expr.func, ast.Attribute) \
                and node.context_expr.func.attr == "cursor":
            cursors.add(node.optional_vars.id)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "cursor":
            cursors.update(t.id for t in node.targets if isinstance(t, ast.Name))

    def is_cursor(expr: ast.AST) -> bool:
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "cursor":
            return True
        name = expr.id if isinstance(expr, ast.Name) else expr.attr if isinstance(expr, ast.Attribute) else ""
        return name in cursors or "cursor" in name.lower()

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in EXECUTE_METHODS and is_cursor(func.value):
                found.append(Violation(path, node.lineno, "raw-sql", f"cursor.{func.attr}()"))
            elif isinstance(func, ast.Attribute) and func.attr in RAW_METHODS and (node.args or node.keywords):
                found.append(Violation(path, node.lineno, "raw-sql", f".{func.attr}()"))
            elif (isinstance(func, ast.Name) and func.id == "RawSQL") or \
                    (isinstance(func, ast.Attribute) and func.attr == "RawSQL"):
                found.append(Violation(path, node.lineno, "raw-sql", "RawSQL()"))
        if id(node) in docstrings:
            continue
        text = _string_text(node)
        if text is not None and SQL_STATEMENT.search(text):
            if isinstance(node, ast.Constant) and any(
                    isinstance(parent, ast.JoinedStr) and node in parent.values for parent in ast.walk(tree)):
                continue  # reported once, as its f-string
            found.append(Violation(path, node.lineno, "raw-sql", f"SQL literal {text[:40]!r}"))
    return found


# --- 4. one egress adapter -----------------------------------------------------
HTTP_CLIENT_MODULES = frozenset({"requests", "httpx", "urllib.request", "http.client", "urllib3", "aiohttp"})


def _is_http_client(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in HTTP_CLIENT_MODULES)


def check_http_imports(source: str, path: str) -> list[Violation]:
    """Report every import of an HTTP client library.

    Covers ``import requests``, ``import urllib.request``, ``from http import
    client``, ``from urllib import request``, and ``importlib.import_module`` /
    ``__import__`` with a constant name. ``urllib.parse`` and ``http.server``
    are not clients. Which files may import a client is the caller's exemption.

    Args:
        source: Python source text.
        path: repository-relative path for the report.

    Returns:
        Violations with rule ``http-import``.

    Raises:
        SyntaxError: ``source`` does not parse.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in {"import_module", "__import__"}:
                modules = [node.args[0].value]
        hits = sorted({m for m in modules if _is_http_client(m)})
        if hits:
            found.append(Violation(path, node.lineno, "http-import", f"imports {hits[0]}"))
    return found


# --- 5. stateful models are guarded and have one CAS store --------------------
def check_stateful_models(models: Iterable[type], stores: Iterable[type]) -> list[Violation]:
    """Report stateful models that escape the kernel's write discipline (ARCHITECTURE.md section 6).

    A model with a concrete ``state`` field must derive from
    :class:`nexusflow.kernel.models.GuardedModel` and have exactly one
    :class:`nexusflow.kernel.store.CasStore` subclass among ``stores`` whose
    ``model`` is it and whose ``machine.name`` is ``"<app_label>.<Model>"``.

    Args:
        models: Django model classes to check (abstract ones are skipped).
        stores: CasStore subclasses to match against.

    Returns:
        Violations with rule ``stateful-model``; ``path`` is the model label, ``line`` 0.
    """
    from nexusflow.kernel.models import GuardedModel

    stores = list(stores)
    found = []
    for model in models:
        if model._meta.abstract or "state" not in {f.name for f in model._meta.concrete_fields}:
            continue
        label = f"{model._meta.app_label}.{model.__name__}"
        if not issubclass(model, GuardedModel):
            found.append(Violation(label, 0, "stateful-model", "does not derive from GuardedModel"))
        own = [s for s in stores if getattr(s, "model", None) is model]
        if len(own) != 1:
            found.append(Violation(label, 0, "stateful-model",
                                   f"has {len(own)} CasStore subclasses ({', '.join(s.__name__ for s in own)})"))
        for store in own:
            name = getattr(getattr(store, "machine", None), "name", None)
            if name != label:
                found.append(Violation(label, 0, "stateful-model", f"{store.__name__}.machine.name is {name!r}"))
    return found


def all_subclasses(cls: type) -> list[type]:
    """Every transitive subclass of ``cls`` defined in project code (not ``tests``) that sets its own ``model``."""
    out, stack = [], list(cls.__subclasses__())
    while stack:
        sub = stack.pop()
        stack.extend(sub.__subclasses__())
        if "model" in vars(sub) and not sub.__module__.startswith("tests."):
            out.append(sub)
    return sorted(set(out), key=lambda s: (s.__module__, s.__qualname__))


# --- 6. locks and state writes go through stores ---------------------------------
_WRITERS = frozenset({"update", "delete", "save", "save_base", "_update", "_raw_delete", "_insert", "bulk_create",
                      "bulk_update", "create", "get_or_create", "update_or_create"})
_SQL_QUERIES = frozenset({"UpdateQuery", "DeleteQuery", "InsertQuery"})


def _base_class(node: ast.AST) -> str | None:
    """``"QuerySet"``/``"Model"``/``"Manager"`` when ``node`` names Django's base class itself."""
    name = getattr(node, "id", None) or getattr(node, "attr", None)
    return name if name in {"QuerySet", "Model", "Manager", "BaseManager"} else None


#: The kernel's row readers (nexusflow/kernel/rows.py) that can read with a lock.
_ROW_LOCKERS = frozenset({"get_row", "fetch_where", "fetch_joined"})


def _locking_row_read(node: ast.Call) -> bool:
    """Whether ``node`` calls a row reader with a lock (``lock=``, or a ``suffix=`` that locks or is not literal)."""
    name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
    if name not in _ROW_LOCKERS:
        return False
    for keyword in node.keywords:
        value = keyword.value
        literal = value.value if isinstance(value, ast.Constant) else None
        if keyword.arg == "lock" and literal != "":
            return True
        if keyword.arg == "suffix" and (not isinstance(literal, str) or "FOR UPDATE" in literal.upper()
                                        or "SHARE MODE" in literal.upper()):
            return True
    return False


def check_store_discipline(source: str, path: str) -> list[Violation]:
    """Report lock and write shortcuts that bypass the stores (ARCHITECTURE.md section 6).

    Outside ``store.py`` (and migrations):

    - ``select_for_update`` is refused: a lock taken there would skip the
      lock-order check (``CasStore.lock``, ``lock_where`` and ``lock_all`` note
      their position first); so is a locking read through the kernel's row
      readers (``get_row(..., lock=...)``, ``fetch_where``/``fetch_joined`` with a
      ``FOR UPDATE`` or ``LOCK IN SHARE MODE`` suffix). ``nexusflow/kernel/rows.py``
      itself, the readers the stores call, is the one exception;
    - ``insert(..., allow_any_state=...)`` is refused: only test fixtures may
      insert a stateful row in a non-initial state;
    - ``@transaction.atomic`` as a decorator is refused: one ``Atomic`` object
      would be reused by every call, and entry points open their transaction
      explicitly with ``transaction.atomic(durable=True)`` (CONVENTIONS.md);
    - calling Django's base classes unbound (``models.QuerySet.update(qs)``,
      ``models.Model.delete(obj)``), its SQL write query classes, or setting
      the store-insert flag is refused: each skips the guarded overrides.

    Returns:
        Violations with rule ``store-discipline``.
    """
    if path.endswith("/store.py") or path == "store.py" or "/migrations/" in path:
        return []
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in _WRITERS and _base_class(node.value):
            found.append(Violation(path, node.lineno, "store-discipline",
                                   f"unbound {_base_class(node.value)}.{node.attr} bypasses the guarded classes"))
        elif (isinstance(node, (ast.Name, ast.Attribute)) and (getattr(node, "id", None) or node.attr) in _SQL_QUERIES
              or isinstance(node, ast.ImportFrom) and any(a.name in _SQL_QUERIES for a in node.names)):
            found.append(Violation(path, node.lineno, "store-discipline", "Django SQL write query class"))
        elif isinstance(node, ast.Attribute) and node.attr == "_nexus_store_insert" and \
                not path.endswith("nexusflow/kernel/models.py"):
            found.append(Violation(path, node.lineno, "store-discipline", "store-insert flag outside kernel.models"))
        elif isinstance(node, ast.Attribute) and node.attr == "select_for_update":
            if not path.endswith("nexusflow/kernel/rows.py"):
                found.append(Violation(path, node.lineno, "store-discipline", "select_for_update outside a store"))
        elif isinstance(node, ast.Call) and _locking_row_read(node) and not path.endswith("nexusflow/kernel/rows.py"):
            found.append(Violation(path, node.lineno, "store-discipline", "locking row read outside a store"))
        elif isinstance(node, ast.Call) and any(k.arg == "allow_any_state" for k in node.keywords):
            found.append(Violation(path, node.lineno, "store-discipline", "insert(allow_any_state=...) outside tests"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if isinstance(target, ast.Attribute) and target.attr == "atomic" or \
                        isinstance(target, ast.Name) and target.id == "atomic":
                    found.append(Violation(path, deco.lineno, "store-discipline",
                                           f"@atomic decorator on {node.name}()"))
    return found


# --- 7. imports point down the app layers, and no module cycles -----------------
#: Apps from left (lowest) to right (ARCHITECTURE.md section 2, "Which way imports point"). A module
#: may import its own app and any app of a lower layer; two apps of one layer never import each other.
APP_LAYERS: dict[str, int] = {
    "nexusflow.kernel": 0,
    "nexusflow.records": 1,
    "runtime_outbox": 2,
    "nexusflow.flows": 3,
    "connectors": 3,
    "cutover": 4,
    "packs": 5,
}
#: The composition root: settings, URL tree, WSGI entry, database router, and the entry scripts
#: outside the apps. It wires the apps together, so it may import any app; no app imports it.
COMPOSITION_ROOT = frozenset({"nexusflow.settings", "nexusflow.urls", "nexusflow.wsgi", "nexusflow.routers",
                              "manage", "scripts"})
COMPOSITION_LAYER = 6
#: Test code: excluded as an importer, and no app may import it.
TESTS_LAYER = 7
#: Project-level modules that are not the composition root count as kernel mechanism:
#: ``nexusflow.api_errors`` (one DRF handler over kernel errors) and ``nexusflow.workers`` (the worker
#: role table, which a kernel-level port must fill from each app's ``ready()``, not import upward).
KERNEL_LEVEL = frozenset({"nexusflow", "nexusflow.api_errors", "nexusflow.workers"})


@dataclass(frozen=True, order=True)
class ImportViolation(Violation):
    """A :class:`Violation` about one import; ``target`` is the dotted module (or name) imported."""

    target: str = ""


def module_name(path: str) -> tuple[str, bool]:
    """``(dotted module, is a package)`` of a repository-relative ``*.py`` path."""
    parts = path[:-3].split("/") if path.endswith(".py") else path.split("/")
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _matches(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def app_of(module: str) -> tuple[str, int] | None:
    """``(app, layer)`` of a dotted name, or ``None`` for a module outside the project (stdlib, Django...)."""
    if _matches(module, "tests"):
        return "tests", TESTS_LAYER
    for root in COMPOSITION_ROOT:
        if _matches(module, root):
            return "composition root", COMPOSITION_LAYER
    for app in sorted(APP_LAYERS, key=len, reverse=True):
        if _matches(module, app):
            return app, APP_LAYERS[app]
    for name in KERNEL_LEVEL:
        if _matches(module, name):
            return "nexusflow.kernel", APP_LAYERS["nexusflow.kernel"]
    return None


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str | None:
    """The absolute module a ``from <level dots><name> import`` in ``module`` names (``None``: beyond the top)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 > len(package) - 1:
        return None
    base = package[:len(package) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_statements(source: str, path: str) -> list[tuple[int, str]]:
    """Every import in ``source`` as ``(line, absolute dotted name)``, wherever it stands.

    Covers ``import a.b``, ``from a import b`` (reported as ``a.b``: ``b`` may be
    a module or a name in ``a``), relative imports resolved against ``path``'s
    package, and ``importlib.import_module`` / ``__import__`` calls whose name is a
    string literal (a relative literal is resolved against a literal ``package``).
    Imports inside functions, classes, ``if TYPE_CHECKING:`` and ``try:`` blocks
    count like module-level ones.

    Args:
        source: Python source text.
        path: repository-relative path of the module, used to resolve relative imports.

    Returns:
        ``(line, name)`` pairs in source order; a relative import beyond the top
        package is reported with the name ``"<beyond top package>"``.

    Raises:
        SyntaxError: ``source`` does not parse.
    """
    module, is_package = module_name(path)
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module if node.level == 0 else _resolve_relative(module, is_package, node.level, node.module)
            if base is None:
                found.append((node.lineno, "<beyond top package>"))
                continue
            found += [(node.lineno, base if alias.name == "*" else f"{base}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name not in {"import_module", "__import__"}:
                continue
            target = node.args[0].value
            if target.startswith("."):
                anchor = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "package"), None)
                if not (isinstance(anchor, ast.Constant) and isinstance(anchor.value, str)):
                    continue
                dots = len(target) - len(target.lstrip("."))
                resolved = _resolve_relative(anchor.value, True, dots, target[dots:] or None)
                target = resolved or "<beyond top package>"
            found.append((node.lineno, target))
    return sorted(found)


def _known(name: str, modules: frozenset[str]) -> str:
    """The longest prefix of ``name`` that is a module in ``modules`` (``name`` itself when none is)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return name


def check_import_direction(source: str, path: str, modules: frozenset[str] = frozenset()) -> list[ImportViolation]:
    """Report every import that points up the app layers or across to the sibling app.

    The rule of :data:`APP_LAYERS`: a module may import its own app and the
    apps of a lower layer; ``nexusflow.flows`` and ``connectors`` (one layer)
    never import each other; only the :data:`COMPOSITION_ROOT` may import any
    app, and nothing imports the composition root or ``tests``. A migration may
    import only its own app and the kernel (its field types); other apps it names
    by label string. Every form of :func:`import_statements` counts.

    Args:
        source: Python source text.
        path: repository-relative path; it names the importing module and app.
            A file outside the apps (and the composition root) returns ``[]``.
        modules: the project's dotted module names, to name the imported
            module (``from connectors import workers`` -> ``connectors.workers``)
            rather than a name inside it; without them the name is reported as written.

    Returns:
        Violations with rule ``import-direction``; ``target`` is the imported module.

    Raises:
        SyntaxError: ``source`` does not parse.
    """
    module, _ = module_name(path)
    own = app_of(module)
    if own is None or own[1] >= COMPOSITION_LAYER:
        return []
    own_app, own_layer = own
    migration = "migrations" in path.split("/")
    found = []
    for line, name in sorted(set(import_statements(source, path))):
        target = _known(name, modules)
        if name == "<beyond top package>":
            found.append(ImportViolation(path, line, "import-direction", "relative import beyond the top package",
                                         name))
            continue
        other = app_of(name)
        if other is None or other[0] == own_app:
            continue
        other_app, other_layer = other
        if migration and other_app != "nexusflow.kernel":
            why = f"a migration imports only its own app and the kernel, not {other_app}"
        elif other_layer > own_layer:
            why = f"{own_app} (layer {own_layer}) imports upward from {other_app} (layer {other_layer})"
        elif other_layer == own_layer:
            why = f"{own_app} and {other_app} never import each other"
        else:
            continue
        violation = ImportViolation(path, line, "import-direction", f"imports {target}: {why}", target)
        if violation not in found:
            found.append(violation)
    return found


def import_graph(sources: dict[str, str]) -> dict[str, dict[str, int]]:
    """The module import graph: ``module -> {imported project module: first line}``.

    Args:
        sources: repository-relative path -> source text of every module of the graph.

    Returns:
        One node per path (its dotted name); an edge per import of another node,
        in any form :func:`import_statements` finds (in-function imports too),
        pointing at the module named (``from a import b`` points at ``a.b`` when
        that is a module, else at ``a``). Parent packages' ``__init__`` are not
        edges of their own.
    """
    names = {path: module_name(path)[0] for path in sources}
    modules = frozenset(names.values())
    graph: dict[str, dict[str, int]] = {}
    for path, source in sources.items():
        edges = graph.setdefault(names[path], {})
        for line, name in import_statements(source, path):
            target = _known(name, modules)
            if target in modules and target != names[path]:
                edges.setdefault(target, line)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one node, each sorted, in sorted order.

    Tarjan's algorithm, iterative (no recursion limit on a deep import chain).
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def shortest_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """One shortest cycle through ``component[0]`` inside ``component``, as ``[a, b, ..., a]`` (breadth first)."""
    start, members = component[0], set(component)
    parents: dict[str, str] = {start: start}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph.get(node, {})):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(parents[path[-1]])
                return [*reversed(path), start]
            if child in members and child not in parents:
                parents[child] = node
                queue.append(child)
    raise ValueError(f"{component} is not a strongly connected component of the graph")


def check_import_cycles(sources: dict[str, str]) -> list[tuple[frozenset[str], Violation]]:
    """Report every import cycle among ``sources`` (path -> text): one violation per strongly connected component.

    Returns:
        ``(component's modules, violation)`` pairs; the violation names the first
        module's path and the line of its import into the cycle, rule ``import-cycle``,
        and one shortest cycle through it plus the component's size.
    """
    graph = import_graph(sources)
    paths = {module_name(p)[0]: p for p in sources}
    found = []
    for component in strongly_connected(graph):
        cycle = shortest_cycle(graph, component)
        line = graph[cycle[0]][cycle[1]]
        detail = " -> ".join(cycle) + (f" (component of {len(component)} modules)" if len(component) > len(cycle) - 1
                                       else "")
        found.append((frozenset(component), Violation(paths[cycle[0]], line, "import-cycle", detail)))
    return found
