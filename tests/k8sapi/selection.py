"""``labelSelector`` and ``fieldSelector`` as the API server reads them, for lists and watches.

Labels: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``, joined by
commas. Fields (pods): ``metadata.name``, ``metadata.namespace``, ``status.phase`` with ``=``,
``==`` or ``!=``; anything else is a 400, as on a real server, so a client relying on an
unsupported selector finds out rather than getting every pod.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .objects import JSON, bad_request

__all__ = ["Selector", "parse_selectors"]

Selector = Callable[[JSON], bool]

_SET = re.compile(r"^\s*([^\s!=,()]+)\s+(in|notin)\s+\(([^)]*)\)\s*")
_FIELDS = {
    "metadata.name": lambda pod: pod["metadata"]["name"],
    "metadata.namespace": lambda pod: pod["metadata"]["namespace"],
    "status.phase": lambda pod: pod["status"].get("phase", ""),
}


def _split_terms(selector: str) -> list[str]:
    """Split on the commas outside parentheses."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(selector):
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return [t.strip() for t in terms if t.strip()]


def _label_term(term: str) -> Selector:
    m = _SET.match(term)
    if m and m.end() == len(term):
        key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
        if op == "in":
            return lambda pod: pod["metadata"].get("labels", {}).get(key) in values
        return lambda pod: pod["metadata"].get("labels", {}).get(key) not in values
    for op in ("!=", "==", "="):
        if op in term:
            key, value = (part.strip() for part in term.split(op, 1))
            if op == "!=":
                return lambda pod: pod["metadata"].get("labels", {}).get(key) != value
            return lambda pod: pod["metadata"].get("labels", {}).get(key) == value
    if term.startswith("!"):
        key = term[1:].strip()
        return lambda pod: key not in pod["metadata"].get("labels", {})
    if re.fullmatch(r"[A-Za-z0-9._/-]+", term):
        return lambda pod: term in pod["metadata"].get("labels", {})
    raise bad_request(f"unable to parse requirement: {term!r}")


def _field_term(term: str) -> Selector:
    for op in ("!=", "==", "="):
        if op in term:
            field, value = (part.strip() for part in term.split(op, 1))
            get = _FIELDS.get(field)
            if get is None:
                raise bad_request(f'field label not supported: "{field}"')
            if op == "!=":
                return lambda pod: bool(get(pod) != value)
            return lambda pod: bool(get(pod) == value)
    raise bad_request(f"invalid field selector: {term!r}")


def parse_selectors(label_selector: str, field_selector: str) -> Selector:
    """One predicate on a Pod for both selectors (400 on a selector this server cannot read)."""
    tests = [_label_term(t) for t in _split_terms(label_selector)]
    tests += [_field_term(t) for t in _split_terms(field_selector)]
    return lambda pod: all(test(pod) for test in tests)
