"""Random values drawn as the template files describe them, in a small, safe subset of Python.

A word problem or a benchmark scenario in `templates/` lists its values as lines such as

    "name, friend = sample(names, 2)"
    "count = randint(2, 6)"
    "total = price_of(errand) * count"

Each line is one assignment. The lines run in order and each expression is evaluated left to
right, as Python would, so the random stream is consumed in exactly the written order: change the
order of two draws and every later document changes. Only the node types below are evaluated (no
attribute access, no other calls), so a template file can describe values but never run code.
"""

from __future__ import annotations

import ast
import operator
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


def other(rng: random.Random, choices: Sequence, *exclude: object):
    """Any of `choices` but the excluded ones."""
    return rng.choice([c for c in choices if c not in exclude])


def wrong_number(rng: random.Random, right: int, low: int = 1) -> int:
    """A plausible but wrong number near `right`, at least `low`."""
    return other(rng, [n for n in range(right - 3, right + 4) if n >= low], right)


def price_of(rng: random.Random, row: Sequence) -> int:
    """A price in won for a priced row [item, counter, shop, lowest, highest]: a multiple of 100."""
    low, high = row[3], row[4]
    return rng.randrange(low, high + 1, 100)


# The functions a template may call; each takes the random stream first.
_RANDOM_FUNCTIONS: dict[str, Callable] = {
    "pick": lambda rng, seq: rng.choice(seq),
    "sample": lambda rng, seq, k: rng.sample(seq, k),
    "randint": lambda rng, low, high: rng.randint(low, high),
    "chance": lambda rng, p: rng.random() < p,
    "other": other,
    "wrong_number": wrong_number,
    "price_of": price_of,
}
_PLAIN_FUNCTIONS: dict[str, Callable] = {"keys": list}

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
}
_UNARY = {ast.USub: operator.neg, ast.Not: operator.not_}
_COMPARE = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


@dataclass(frozen=True)
class Assignment:
    """One line `targets = expression`, parsed once."""

    targets: tuple[str, ...] | str
    expression: ast.expr


def parse_expression(text: str) -> ast.expr:
    return ast.parse(text.strip(), mode="eval").body


def parse_assignment(line: str) -> Assignment:
    statements = ast.parse(line.strip()).body
    if len(statements) != 1 or not isinstance(statements[0], ast.Assign):
        raise ValueError(f"not one assignment: {line!r}")
    (target,) = statements[0].targets
    if isinstance(target, ast.Name):
        return Assignment(target.id, statements[0].value)
    if isinstance(target, ast.Tuple) and all(isinstance(t, ast.Name) for t in target.elts):
        return Assignment(tuple(t.id for t in target.elts), statements[0].value)
    raise ValueError(f"assign to a name or to names separated by commas: {line!r}")


def parse_assignments(lines: Sequence[str]) -> tuple[Assignment, ...]:
    return tuple(parse_assignment(line) for line in lines)


def draw(
    rng: random.Random, assignments: Sequence[Assignment], names: Mapping[str, object]
) -> dict[str, object]:
    """Run `assignments` in order; `names` are what they may read besides earlier values."""
    values: dict[str, object] = {}
    scope = _Scope(rng, names, values)
    for assignment in assignments:
        result = scope.evaluate(assignment.expression)
        if isinstance(assignment.targets, str):
            values[assignment.targets] = result
        else:
            values.update(zip(assignment.targets, result, strict=True))
    return values


def evaluate(rng: random.Random, expression: ast.expr, names: Mapping[str, object]):
    return _Scope(rng, names, {}).evaluate(expression)


class _Scope:
    """Evaluates expressions against the drawn values, then the given names."""

    def __init__(self, rng: random.Random, names: Mapping, values: Mapping) -> None:
        self.rng, self.names, self.values = rng, names, values

    def lookup(self, name: str):
        if name in self.values:
            return self.values[name]
        if name in self.names:
            return self.names[name]
        raise ValueError(f"unknown name {name!r} in a template's values")

    def call(self, node: ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else None
        args = [self.evaluate(a) for a in node.args]
        kwargs = {k.arg: self.evaluate(k.value) for k in node.keywords}
        if name in _RANDOM_FUNCTIONS:
            return _RANDOM_FUNCTIONS[name](self.rng, *args, **kwargs)
        if name in _PLAIN_FUNCTIONS:
            return _PLAIN_FUNCTIONS[name](*args, **kwargs)
        raise ValueError(f"a template may not call {ast.unparse(node.func)!r}")

    def compare(self, node: ast.Compare) -> bool:
        left = self.evaluate(node.left)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = self.evaluate(right_node)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def evaluate(self, node: ast.expr):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [self.evaluate(e) for e in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](self.evaluate(node.left), self.evaluate(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](self.evaluate(node.operand))
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            return self.compare(node)
        if isinstance(node, ast.IfExp):  # only the branch taken is evaluated (and draws)
            return self.evaluate(node.body if self.evaluate(node.test) else node.orelse)
        if isinstance(node, ast.Subscript):
            return self.evaluate(node.value)[self.evaluate(node.slice)]
        if isinstance(node, ast.Slice) and node.step is None:
            low, high = (None if n is None else self.evaluate(n) for n in (node.lower, node.upper))
            return slice(low, high)
        if isinstance(node, ast.Call):
            return self.call(node)
        raise ValueError(f"a template may not use {ast.unparse(node)!r}")
