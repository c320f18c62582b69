"""The decide table's rows and their mutants (run by ``python -m tests.mutation.table_mutation``).

mutmut mutates code inside functions only, so the rows of :mod:`celery_fence._decide` (its module-level
dicts of actions, and the actions its functions return) get a mutation of their own: each row's action is
replaced by every other :class:`~celery_fence._decide.Action`, and the row is deleted (a dict entry
removed; a ``return`` turned into ``pass``, so the function goes on to its next row; one branch of a
conditional return replaced by the other). Some test must fail for each mutant.

The rows are found at run time from the module's source, so rows and actions added later are mutated too:
a row is an entry of a module-level dict whose values are all ``Action.X``, or an ``Action.X`` returned by a
module-level function (alone or as a branch of a conditional expression).

Each mutant is a whole new source of the module (:func:`mutant_source`); tests/mutation/table_mutation.py
applies it to the imported module and runs the tests.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator

DELETE = "(deleted)"


@dataclasses.dataclass(frozen=True)
class Row:
    """One row: ``where`` names it (``_REFUSED[View.SAME_TASK]``, ``_finished:93``), ``action`` its action."""

    where: str
    action: str
    path: tuple[int | str, ...]  # how to find its Action node again in a fresh parse of the module


def rows_of(tree: ast.Module) -> list[Row]:
    """Every row of the table, in source order."""
    rows: list[Row] = []
    for index, stmt in enumerate(tree.body):
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Dict) and value.values and all(map(_is_action, value.values)):
            name = _target_name(stmt)
            for i, (key, val) in enumerate(zip(value.keys, value.values, strict=True)):
                where = f"{name}[{ast.unparse(key) if key is not None else '**'}]"
                rows.append(Row(where, _action_name(val), (index, "dict", i)))
        elif isinstance(stmt, ast.FunctionDef):
            for node_path, node, branch in _returned_actions(stmt, (index,)):
                where = f"{stmt.name}:{node.lineno}{branch}"
                rows.append(Row(where, _action_name(node), node_path))
    return rows


Found = Iterator[tuple[tuple[int | str, ...], ast.expr, str]]


def _returned_actions(node: ast.AST, path: tuple[int | str, ...]) -> Found:
    """The ``Action.X`` nodes a function returns, with their paths (fields and indexes from the top) and,
    for a branch of a conditional return, which one."""
    for field, value in ast.iter_fields(node):
        children = value if isinstance(value, list) else [value]
        for i, child in enumerate(children):
            if not isinstance(child, ast.AST) or isinstance(child, (ast.FunctionDef, ast.Lambda)):
                continue
            child_path = (*path, field, i)
            if isinstance(child, ast.Return) and child.value is not None:
                yield from _actions_in(child.value, (*child_path, "value", 0))
            else:
                yield from _returned_actions(child, child_path)


def _actions_in(node: ast.expr, path: tuple[int | str, ...], branch: str = "") -> Found:
    if _is_action(node):
        yield path, node, branch
    elif isinstance(node, ast.IfExp):
        yield from _actions_in(node.body, (*path, "body", 0), f"{branch} if")
        yield from _actions_in(node.orelse, (*path, "orelse", 0), f"{branch} else")


def _is_action(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Action"


def _action_name(node: ast.expr) -> str:
    assert isinstance(node, ast.Attribute)
    return node.attr


def _target_name(stmt: ast.Assign | ast.AnnAssign) -> str:
    target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
    return ast.unparse(target)


# -- making a mutant --


def mutant_source(source: str, row: Row, replacement: str) -> str:
    """The module's source with ``row``'s action replaced by ``Action.<replacement>``, or the row deleted."""
    tree = ast.parse(source)
    if row.path[1] == "dict":
        index, _, i = row.path
        stmt = tree.body[int(index)]
        table = stmt.value
        assert isinstance(table, ast.Dict)
        if replacement == DELETE:
            del table.keys[int(i)], table.values[int(i)]
        else:
            table.values[int(i)] = _action(replacement)
        return ast.unparse(tree)
    parents = _walk(tree, row.path)
    _, (parent, field, i) = parents[-1]
    if replacement != DELETE:
        _set(parent, field, i, _action(replacement))
    elif isinstance(parent, ast.IfExp):  # one branch deleted: the other answers
        other = parent.orelse if field == "body" else parent.body
        grand, gfield, gi = parents[-2][1]
        _set(grand, gfield, gi, other)
    else:  # the Return's value: the statement becomes ``pass``
        ret, (holder, hfield, hi) = parents[-2]
        assert isinstance(ret, ast.Return)
        _set(holder, hfield, hi, ast.Pass())
    return ast.unparse(ast.fix_missing_locations(tree))


def _walk(tree: ast.Module, path: tuple[int | str, ...]) -> list[tuple[ast.AST, tuple[ast.AST, str, int]]]:
    """Each node along ``path`` with (its parent, the parent's field, the index in it)."""
    node: ast.AST = tree.body[int(path[0])]
    out: list[tuple[ast.AST, tuple[ast.AST, str, int]]] = [(node, (tree, "body", int(path[0])))]
    for field, i in zip(path[1::2], path[2::2], strict=True):
        value = getattr(node, str(field))
        child = value[int(i)] if isinstance(value, list) else value
        out.append((child, (node, str(field), int(i))))
        node = child
    return out


def _set(parent: ast.AST, field: str, i: int, new: ast.AST) -> None:
    value = getattr(parent, field)
    if isinstance(value, list):
        value[i] = new
    else:
        setattr(parent, field, new)


def _action(name: str) -> ast.expr:
    return ast.Attribute(value=ast.Name(id="Action", ctx=ast.Load()), attr=name, ctx=ast.Load())


# -- recording which tests reach which row --


def instrumented_source(source: str, rows: list[Row]) -> str:
    """The module with each row reporting when a run uses it (``_ROW_HITS``, read by table_hits.py)."""
    tree = ast.parse(source)
    for row in rows:
        if row.path[1] == "dict":
            continue
        _, (parent, field, i) = _walk(tree, row.path)[-1]
        node = getattr(parent, field)
        node = node[i] if isinstance(node, list) else node
        call = ast.Call(ast.Name("_row_hit", ast.Load()), [ast.Constant(row.where), node], [])
        _set(parent, field, i, call)
    dict_names = sorted({row.where.partition("[")[0] for row in rows if row.path[1] == "dict"})
    wrap = "\n".join(f"{name} = _RowDict({name!r}, {name})" for name in dict_names)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n" + _HIT_HELPERS + wrap + "\n"


_HIT_HELPERS = """

_ROW_HITS = set()


def _row_hit(where, action):
    _ROW_HITS.add(where)
    return action


class _RowDict(dict):
    def __init__(self, name, rows):
        super().__init__(rows)
        self._name = name

    def __getitem__(self, key):
        _ROW_HITS.add(f"{self._name}[{type(key).__name__}.{key.name}]")
        return super().__getitem__(key)

    def get(self, key, default=None):
        if key in self:
            return self[key]
        return default

"""
